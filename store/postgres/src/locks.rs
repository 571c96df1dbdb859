//! The per-entity locks a command takes inside its transaction, before it reads.
//!
//! Owns [`Lock`] (what a decision reads by key: a stream — an intent's, a run's, a
//! conversation's —, an order, a business reference) and [`Lock::key`], the stable 64-bit
//! key of `pg_advisory_xact_lock`. A lock is taken before the read it guards, so under READ
//! COMMITTED the read sees every commit of whoever held it before; it is released by the
//! transaction's end. It must never be derived from anything but the entity's identity: two
//! processes of two builds must take the same key for the same entity.

use engine::event::StreamId;

/// An entity a decision reads by key.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Lock<'a> {
    /// One stream: an intent, a run, a conversation.
    Stream(&'a StreamId),
    /// One order of one tenant: its intents and the cumulative invariants over them.
    Order {
        /// The tenant.
        tenant: &'a str,
        /// The order.
        order_id: &'a str,
    },
    /// One business reference of one tenant: the charges under it.
    Reference {
        /// The tenant.
        tenant: &'a str,
        /// The reference.
        reference: &'a str,
    },
}

impl Lock<'_> {
    /// The advisory lock key: FNV-1a (64-bit) over a tag and the identity's parts, each
    /// followed by a 0 byte (no part holds one), so `("a", "bc")` and `("ab", "c")` differ.
    /// Stable across builds and platforms by construction; a collision only makes two
    /// entities share a lock (slower, never wrong).
    pub(crate) fn key(&self) -> i64 {
        let parts: [&str; 3] = match self {
            Self::Stream(stream) => ["stream", stream.as_str(), ""],
            Self::Order { tenant, order_id } => ["order", tenant, order_id],
            Self::Reference { tenant, reference } => ["reference", tenant, reference],
        };
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for part in parts {
            for byte in part.bytes().chain([0]) {
                hash ^= u64::from(byte);
                hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
            }
        }
        i64::from_ne_bytes(hash.to_ne_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_stable_and_tell_entities_apart() {
        let stream = StreamId::from_stored("run:r1".to_owned());
        // A changed hash would make two builds lock differently: pinned (FNV-1a, computed apart).
        assert_eq!(Lock::Stream(&stream).key(), Lock::Stream(&StreamId::from_stored("run:r1".to_owned())).key());
        assert_eq!(Lock::Order { tenant: "t", order_id: "o" }.key(), 0x064c_4244_5d08_7e76);
        let order = |tenant, order_id| Lock::Order { tenant, order_id }.key();
        assert_ne!(order("a", "bc"), order("ab", "c"), "parts are delimited");
        assert_ne!(
            Lock::Order { tenant: "t", order_id: "o" }.key(),
            Lock::Reference { tenant: "t", reference: "o" }.key(),
            "an order and a reference of the same name are two locks"
        );
    }
}
