//! Sample values for tests and examples, so that every suite, the README and `keel demo`
//! speak of the same tenant and the same card.

/// A tenant id (the workflows require a UUID): the one in the README's examples and in the
/// intent keys `keel demo` prints.
pub const TENANT: &str = "3f1c2a9e-7b1d-4c1e-9a51-0f8e2b6c4d10";

/// A payment method token the charge workflow accepts (a Stripe PaymentMethod id, `pm_…`). Keel stores
/// and logs only its hash.
pub const CARD_TOKEN: &str = "pm_card_visa_4242424242";
