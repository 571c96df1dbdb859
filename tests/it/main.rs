//! Keel's integration suite: one test binary (link time matters on two cores).
//!
//! These tests run the real `keel` and `keel-provider-sim` binaries as child processes.

mod adversarial;
mod agent;
mod agent_attacks;
mod agent_cost;
mod agent_recovery;
mod approvals;
mod chaos;
mod cli;
mod clients;
mod concurrency;
mod console;
mod crash;
mod delegation;
mod doors;
mod facts;
mod files;
mod flow;
mod fuzz;
mod golden;
mod hardening;
mod irreversible;
mod kills;
mod leases;
mod metrics;
mod migrate;
mod model;
mod money;
mod operator;
mod otel;
mod policy;
mod postgres;
mod serve;
mod stripe;
mod stripe_faults;
mod teeth;
mod testkit;
mod timers;
mod trace;
mod unknown_outcome;
mod vault;
mod worker;
