//! What every weir crate shares: classified user-facing errors, case-insensitive connector
//! options with typed parsing, Spark-style duration strings, and storage locations (checkpoints
//! and file sinks) on `object_store` with create-only writes.

#[cfg(feature = "delta")]
pub mod delta;
pub mod duration;
pub mod error;
pub mod failpoint;
pub mod location;
pub mod options;

pub use duration::parse_duration;
pub use error::ClassifiedError;
pub use location::{Created, Location};
pub use options::{OptionReader, Options};
