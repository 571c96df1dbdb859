//! The store's integration tests: one binary, so two cores link once.

mod concurrency;
mod integrity;
mod schema;
mod support;
mod writer;
