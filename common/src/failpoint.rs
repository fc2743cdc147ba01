//! Pause points for crash tests: with `WEIR_TEST_PAUSE_AT=<stage>:<batch>` in the environment,
//! the process stops at that stage of that batch, prints `WEIR_PAUSED <stage> <batch>` on
//! standard error and waits to be killed (the crash tests send SIGKILL). Without the variable
//! a pause point costs one comparison.

use std::sync::OnceLock;
use std::time::Duration;

/// The environment variable naming the pause point.
pub const PAUSE_ENV: &str = "WEIR_TEST_PAUSE_AT";

fn spec() -> &'static Option<(String, u64)> {
    static SPEC: OnceLock<Option<(String, u64)>> = OnceLock::new();
    SPEC.get_or_init(|| {
        let v = std::env::var(PAUSE_ENV).ok()?;
        let (stage, batch) = v.split_once(':')?;
        Some((stage.to_string(), batch.parse().ok()?))
    })
}

/// Pauses here, forever, if the environment asks for `stage` of `batch`.
pub fn pause_point(stage: &str, batch: u64) {
    if let Some((s, b)) = spec()
        && s == stage
        && *b == batch
    {
        eprintln!("WEIR_PAUSED {stage} {batch}");
        loop {
            std::thread::sleep(Duration::from_secs(3600));
        }
    }
}
