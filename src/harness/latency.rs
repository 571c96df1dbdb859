//! Latencies of a benchmark pass in bounded memory: a log-linear histogram of microseconds.
//!
//! Owns [`Latencies`], what `keel bench` and `keel serve-bench` record per request and read
//! their percentiles from. A benchmark of a million charges must not measure its own
//! bookkeeping: a `Vec<Duration>` grew by 16 bytes a request (32 MB over a million charges
//! and their re-submissions), which hid whether the engine's memory stays flat. The histogram
//! is one fixed array whatever the count, and a percentile it reports is the lower bound of
//! the bucket holding the exact one: under 1 % below it (each power of two is cut into
//! [`SUB_BUCKETS`] equal buckets; below `SUB_BUCKETS` µs every microsecond has its own).
//!
//! It must never sort, keep or allocate per request.

use std::time::Duration;

/// Buckets per power of two: the relative width of a bucket is at most `1 / SUB_BUCKETS`.
const SUB_BUCKETS: u64 = 128;
/// `log2(SUB_BUCKETS)`.
const SUB_BITS: u32 = SUB_BUCKETS.trailing_zeros();
/// Exact microseconds below `SUB_BUCKETS`, then `SUB_BUCKETS` buckets for each power of two
/// from `2^SUB_BITS` to `2^63`.
const BUCKETS: usize = (SUB_BUCKETS + (64 - SUB_BITS as u64) * SUB_BUCKETS) as usize;

/// How long each request of a pass took, counted per bucket.
#[derive(Clone)]
pub struct Latencies {
    counts: Box<[u64; BUCKETS]>,
    total: u64,
}

impl Default for Latencies {
    fn default() -> Self {
        Self { counts: Box::new([0; BUCKETS]), total: 0 }
    }
}

impl Latencies {
    /// Counts one request that took `elapsed` (saturating at `u64::MAX` microseconds).
    pub fn record(&mut self, elapsed: Duration) {
        let micros = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        self.counts[bucket_of(micros)] += 1;
        self.total += 1;
    }

    /// Adds every request `other` counted.
    pub fn merge(&mut self, other: &Self) {
        for (mine, theirs) in self.counts.iter_mut().zip(other.counts.iter()) {
            *mine += theirs;
        }
        self.total += other.total;
    }

    /// How many requests were counted.
    pub fn count(&self) -> u64 {
        self.total
    }

    /// The `p` quantile (`0.0..=1.0`) in milliseconds: the latency of the request at rank
    /// `⌊count × p⌋` (the last one for `p = 1`), as its bucket's lower bound; 0 when nothing
    /// was counted.
    pub fn percentile_ms(&self, p: f64) -> f64 {
        if self.total == 0 {
            return 0.0;
        }
        let rank = ((self.total as f64 * p) as u64).min(self.total - 1);
        let mut seen = 0;
        for (bucket, count) in self.counts.iter().enumerate() {
            seen += count;
            if seen > rank {
                return lower_bound(bucket) as f64 / 1000.0;
            }
        }
        unreachable!("the counts add up to the total, which is above the rank")
    }
}

/// The bucket of a latency of `micros` microseconds.
fn bucket_of(micros: u64) -> usize {
    if micros < SUB_BUCKETS {
        return micros as usize;
    }
    let exponent = 63 - micros.leading_zeros(); // at least SUB_BITS
    let sub = (micros >> (exponent - SUB_BITS)) - SUB_BUCKETS;
    (SUB_BUCKETS + u64::from(exponent - SUB_BITS) * SUB_BUCKETS + sub) as usize
}

/// The smallest latency, in microseconds, that falls in `bucket`.
fn lower_bound(bucket: usize) -> u64 {
    let bucket = bucket as u64;
    if bucket < SUB_BUCKETS {
        return bucket;
    }
    let exponent = (bucket - SUB_BUCKETS) / SUB_BUCKETS + u64::from(SUB_BITS);
    let sub = (bucket - SUB_BUCKETS) % SUB_BUCKETS;
    (SUB_BUCKETS + sub) << (exponent - u64::from(SUB_BITS))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The exact percentile, as the benchmarks computed it before: sort and index.
    fn exact_ms(sorted: &[u64], p: f64) -> f64 {
        let rank = ((sorted.len() as f64 * p) as usize).min(sorted.len() - 1);
        sorted[rank] as f64 / 1000.0
    }

    #[test]
    fn every_bucket_starts_where_the_one_before_it_ends() {
        for bucket in 1..BUCKETS {
            let start = lower_bound(bucket);
            assert_eq!(bucket_of(start), bucket, "bucket {bucket} starts at {start} µs");
            assert_eq!(bucket_of(start - 1), bucket - 1, "the microsecond before bucket {bucket} is in the one before");
        }
        assert_eq!(bucket_of(u64::MAX), BUCKETS - 1);
    }

    #[test]
    fn a_percentile_is_at_most_one_percent_below_the_exact_one_and_never_above() {
        // Latencies from 3 µs to past an hour, spread over every scale the histogram cuts.
        let mut state = 0x9e37_79b9_7f4a_7c15_u64;
        let mut samples = Vec::new();
        let mut latencies = Latencies::default();
        for _ in 0..50_000 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let micros = (3 + state % 4_000_000_000) >> (state % 32);
            samples.push(micros);
            latencies.record(Duration::from_micros(micros));
        }
        samples.sort_unstable();
        for p in [0.0, 0.01, 0.25, 0.5, 0.9, 0.99, 0.999, 1.0] {
            let (exact, histogram) = (exact_ms(&samples, p), latencies.percentile_ms(p));
            assert!(histogram <= exact, "p{p}: {histogram} ms above the exact {exact} ms");
            assert!(histogram >= exact * (1.0 - 1.0 / SUB_BUCKETS as f64), "p{p}: {histogram} ms, exact {exact} ms");
        }
        assert_eq!(latencies.count(), 50_000);
    }

    #[test]
    fn merged_tallies_answer_as_one_and_an_empty_one_answers_zero() {
        let (mut fast, mut slow, mut both) = (Latencies::default(), Latencies::default(), Latencies::default());
        for ms in 1..=50 {
            fast.record(Duration::from_millis(ms));
            both.record(Duration::from_millis(ms));
        }
        for ms in 51..=100 {
            slow.record(Duration::from_millis(ms));
            both.record(Duration::from_millis(ms));
        }
        fast.merge(&slow);
        assert_eq!(fast.count(), 100);
        for p in [0.0, 0.5, 0.99, 1.0] {
            assert_eq!(fast.percentile_ms(p), both.percentile_ms(p), "p{p}");
        }
        let median = fast.percentile_ms(0.5);
        assert!(
            median <= 51.0 && median >= 51.0 * (1.0 - 1.0 / SUB_BUCKETS as f64),
            "rank 50 of 1..=100 ms is 51 ms: {median}"
        );
        assert_eq!(Latencies::default().percentile_ms(0.99), 0.0);
    }
}
