//! The store's integration tests: one binary, so two cores link once.

mod concurrency;
mod equivalence;
mod format;
mod integrity;
mod keys;
mod migration;
mod projection;
mod rows;
mod schema;
mod support;
mod vault;
mod writer;
