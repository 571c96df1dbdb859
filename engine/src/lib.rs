//! Keel's pure core.
pub mod canonical;
pub mod clock;
pub mod provider;
