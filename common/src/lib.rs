//! What every weir crate shares: classified user-facing errors, case-insensitive connector
//! options with typed parsing, Spark-style duration strings, and storage locations (checkpoints
//! and file sinks) on `object_store` with create-only writes.

pub mod batch_id;
#[cfg(feature = "delta")]
pub mod delta;
pub mod duration;
pub mod error;
pub mod failpoint;
pub mod location;
pub mod options;
pub mod sealed;

pub use duration::parse_duration;
pub use error::ClassifiedError;
pub use location::{Created, Location};
pub use options::{OptionReader, Options};

/// Runs `f` to completion on a thread of its own with a runtime of its own: for the synchronous
/// parts of planning (a source's schema, a checkpoint's state schema) that need async I/O and
/// may themselves run on an async runtime. Nothing made on that runtime (a table, a client)
/// should outlive the call.
pub fn block_on<F>(f: F) -> Result<F::Output, ClassifiedError>
where
    F: std::future::Future + Send,
    F::Output: Send,
{
    std::thread::scope(|s| {
        s.spawn(|| {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map(|rt| rt.block_on(f))
        })
        .join()
    })
    .map_err(|_| ClassifiedError::new("INTERNAL_ERROR", "XX000", "a blocking task panicked"))?
    .map_err(|e| {
        ClassifiedError::new(
            "INTERNAL_ERROR",
            "XX000",
            format!("cannot start a runtime for a blocking task: {e}"),
        )
    })
}
