//! Declarative pipelines (Spark Declarative Pipelines, with Databricks' additions): a project
//! of SQL files whose datasets (streaming tables, materialized views, temporary views) are
//! fed by named flows, each flow with a checkpoint the pipeline keeps.
//!
//! ```text
//! weir-pipeline.yml ──► spec      name, storage, libraries (globs of .sql files),
//!                                 configuration; found from the working directory upwards
//! weir pipeline init ─► init      a project folder with a spec and an example that runs as is
//! library files ────► graph       datasets and flows, checked, in stages of dependency order
//! dry-run, run ─────► check      every flow planned, and checked against its checkpoint,
//!                                 before anything is read or written
//! weir pipeline run ─► run        one update: every flow, stage after stage, into Delta tables
//!                                 under the storage, each flow with its own checkpoint
//! ```

pub mod check;
pub mod events;
pub mod graph;
pub mod init;
pub mod run;
pub mod spec;

pub use check::{FlowCheck, check_flows};
pub use events::{Event, Observer, UpdateObserver};
pub use graph::{Dataset, DatasetKind, Flow, FlowKind, Graph};
pub use init::init_project;
pub use run::{
    FlowOutcome, FlowRun, Layout, UpdateOptions, reset_flows, run_update, run_update_until,
    session_for,
};
pub use spec::PipelineSpec;
