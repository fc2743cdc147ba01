//! weir's integration tests, in one test binary so that RocksDB, DataFusion, delta-rs and Kafka's
//! client are linked once: one module per area, their shared helpers (the CLI runner, the kill
//! helpers, row builders, folder snapshots) in `support`. The SQL logic tests are the other test
//! binary (`tests/sqllogictest.rs`, with its own runner). Run one area with
//! `cargo test --workspace --test integration cli::`.

#![expect(
    clippy::unwrap_used,
    reason = "a test fails loudly on any unexpected error"
)]

mod support;

mod api;
mod auto_cdc;
mod checkpoint_tools;
mod cli;
mod crash;
mod damaged_checkpoints;
mod delta;
mod files;
#[cfg(feature = "kafka")]
mod kafka;
mod nexmark;
mod pipelines;
mod s3;
#[cfg(feature = "server")]
mod server;
mod shell;
mod source_evolution;
mod stateful;
#[cfg(feature = "server")]
mod ui;
