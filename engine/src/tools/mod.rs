//! The offline checkpoint tools: they read, check, rewrite and replay a checkpoint while no
//! query runs on it (or, for `read_state`, beside a running one). None is on the batch loop's
//! path.
//!
//! ```text
//! inspect        weir checkpoint inspect: what a checkpoint holds, as a report
//! validate       weir checkpoint validate: every restart check, read only (writer.rs runs them)
//! reset          weir checkpoint reset: full refresh, or a selective reset of changed operators
//! repartition    weir checkpoint repartition: the state re-split into N partitions
//! replay         weir checkpoint replay: batch N run again, touching neither sink nor checkpoint
//! state_reader   read_state(...) and read_state_metadata(...) table functions
//! writer         the tools on DataStreamWriter (validate, reset_checkpoint, refresh_checkpoint)
//! ```
//!
//! Each operator kind says how its state is laid out (`crate::stateful::OperatorKind`): the
//! state reader and repartition are generic over it.

pub mod inspect;
pub mod repartition;
pub(crate) mod replay;
pub mod reset;
pub mod state_reader;
pub mod validate;
mod writer;
