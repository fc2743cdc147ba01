//! `weir pipeline init NAME`: a new project folder, as `spark-pipelines init` makes one.
//!
//! ```text
//! NAME/
//!   weir-pipeline.yml          name, storage (pipeline-storage, relative to the spec so the
//!                              folder can move), libraries: transformations/**
//!   pipeline-storage/          checkpoints, tables, the event log
//!   transformations/example.sql
//!                              a streaming table fed by the rate source and a materialized
//!                              view over it: runs as it is
//! ```

use std::path::{Path, PathBuf};

use weir_common::ClassifiedError;

/// The example every new project starts with.
pub const EXAMPLE_SQL: &str = "\
-- A streaming table fed by the rate source: every update reads the rows the source made since
-- the last one (four per micro-batch here) and appends them.
CREATE STREAMING TABLE numbers AS
SELECT value, timestamp
FROM STREAM rate_micro_batch(rowsPerBatch => 4);

-- A materialized view: recomputed from the table in every update, after the flow into it.
CREATE MATERIALIZED VIEW even_and_odd AS
SELECT value % 2 = 0 AS even, count(*) AS n
FROM numbers
GROUP BY value % 2 = 0;
";

fn spec_text(name: &str) -> String {
    format!(
        "name: {name}\n\
         # Checkpoints, tables and the event log: a folder (relative to this file), file:// or s3://.\n\
         storage: pipeline-storage\n\
         libraries:\n  - glob:\n      include: transformations/**\n"
    )
}

/// Creates the project `name` in `parent` and returns its folder.
pub fn init_project(parent: &Path, name: &str) -> Result<PathBuf, ClassifiedError> {
    let valid = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if !valid {
        return Err(ClassifiedError::new(
            "INVALID_PIPELINE_NAME",
            "42602",
            format!(
                "'{name}' is not a pipeline name: use letters, digits, '_' and '-' (it names \
                 the project's folder)."
            ),
        ));
    }
    let dir = parent.join(name);
    if dir.exists() {
        return Err(ClassifiedError::new(
            "PIPELINE_PROJECT_EXISTS",
            "42710",
            format!(
                "'{}' already exists: choose another name, or remove it first.",
                dir.display()
            ),
        ));
    }
    let io = |e: std::io::Error| {
        ClassifiedError::new(
            "PIPELINE_PROJECT_NOT_CREATED",
            "58030",
            format!("Cannot create the project '{}': {e}.", dir.display()),
        )
    };
    std::fs::create_dir_all(dir.join("transformations")).map_err(io)?;
    std::fs::create_dir_all(dir.join("pipeline-storage")).map_err(io)?;
    std::fs::write(dir.join("weir-pipeline.yml"), spec_text(name)).map_err(io)?;
    std::fs::write(dir.join("transformations/example.sql"), EXAMPLE_SQL).map_err(io)?;
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::PipelineSpec;

    #[test]
    fn a_new_project_holds_a_spec_that_reads_back_and_its_example() {
        let parent = tempfile::tempdir().unwrap();
        let dir = init_project(parent.path(), "orders").unwrap();
        let spec =
            PipelineSpec::load(&PipelineSpec::find(&dir.join("transformations")).unwrap()).unwrap();
        assert_eq!(spec.name, "orders");
        assert_eq!(spec.storage, dir.join("pipeline-storage").to_string_lossy());
        assert_eq!(
            spec.library_files().unwrap(),
            [dir.join("transformations/example.sql")]
        );
        assert!(dir.join("pipeline-storage").is_dir());
        assert_eq!(
            init_project(parent.path(), "orders").unwrap_err().class,
            "PIPELINE_PROJECT_EXISTS"
        );
        for bad in ["", "a/b", "..", "x y"] {
            assert_eq!(
                init_project(parent.path(), bad).unwrap_err().class,
                "INVALID_PIPELINE_NAME",
                "{bad:?}"
            );
        }
    }
}
