//! The `memory` sink: keeps the output in memory as a table named after the query, queryable
//! with SQL in the same session while the query runs. Idempotent by batch ID.

use std::sync::{Arc, RwLock};

use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use async_trait::async_trait;
use weir_common::ClassifiedError;

use crate::{OutputMode, Result, Sink};

/// The rows a memory sink holds, shared with the table that reads them.
#[derive(Debug)]
pub struct MemorySinkData {
    schema: SchemaRef,
    /// `(batch_id, rows)` in batch order.
    batches: RwLock<Vec<(u64, Vec<RecordBatch>)>>,
}

impl MemorySinkData {
    /// The schema of the table.
    pub fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }

    /// Every row currently in the table.
    pub fn snapshot(&self) -> Vec<RecordBatch> {
        self.batches
            .read()
            .map(|b| {
                b.iter()
                    .flat_map(|(_, rows)| rows.iter().cloned())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The highest batch ID written, if any.
    pub fn latest_batch_id(&self) -> Option<u64> {
        self.batches.read().ok()?.last().map(|(id, _)| *id)
    }
}

/// Writes each batch into a shared in-memory table.
#[derive(Debug, Clone)]
pub struct MemorySink {
    name: String,
    mode: OutputMode,
    data: Arc<MemorySinkData>,
}

impl MemorySink {
    /// A memory sink whose table is called `name`.
    pub fn new(name: impl Into<String>, schema: SchemaRef, mode: OutputMode) -> Self {
        Self {
            name: name.into(),
            mode,
            data: Arc::new(MemorySinkData {
                schema,
                batches: RwLock::new(vec![]),
            }),
        }
    }

    /// The table's name (the query name).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The rows, shared with whoever reads the table.
    pub fn data(&self) -> Arc<MemorySinkData> {
        Arc::clone(&self.data)
    }
}

#[async_trait]
impl Sink for MemorySink {
    fn description(&self) -> String {
        "MemorySink".to_string()
    }

    fn read_back(&self) -> Option<crate::ReadBack> {
        Some(crate::ReadBack::Memory {
            name: self.name.clone(),
            data: self.data(),
        })
    }

    fn is_idempotent(&self) -> bool {
        true
    }

    async fn add_batch(
        &self,
        batch_id: u64,
        _schema: SchemaRef,
        batches: Vec<RecordBatch>,
    ) -> Result<()> {
        let mut all = self.data.batches.write().map_err(|_| {
            ClassifiedError::new("INTERNAL_ERROR", "XX000", "memory sink lock poisoned")
        })?;
        if all.iter().any(|(id, _)| *id == batch_id) {
            return Ok(());
        }
        if self.mode == OutputMode::Complete {
            all.clear();
        }
        all.push((batch_id, batches));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use arrow::array::Int64Array;
    use arrow::datatypes::{DataType, Field, Schema};

    use super::*;

    fn rows(schema: &SchemaRef, v: &[i64]) -> Vec<RecordBatch> {
        vec![
            RecordBatch::try_new(
                Arc::clone(schema),
                vec![Arc::new(Int64Array::from(v.to_vec()))],
            )
            .unwrap(),
        ]
    }

    #[tokio::test]
    async fn a_redelivered_batch_changes_nothing_and_complete_mode_replaces() {
        let schema = Arc::new(Schema::new(vec![Field::new("v", DataType::Int64, false)]));
        let sink = MemorySink::new("t", Arc::clone(&schema), OutputMode::Append);
        sink.add_batch(0, Arc::clone(&schema), rows(&schema, &[1]))
            .await
            .unwrap();
        sink.add_batch(0, Arc::clone(&schema), rows(&schema, &[1]))
            .await
            .unwrap();
        sink.add_batch(1, Arc::clone(&schema), rows(&schema, &[2]))
            .await
            .unwrap();
        assert_eq!(
            sink.data()
                .snapshot()
                .iter()
                .map(|b| b.num_rows())
                .sum::<usize>(),
            2
        );

        let sink = MemorySink::new("t", Arc::clone(&schema), OutputMode::Complete);
        sink.add_batch(0, Arc::clone(&schema), rows(&schema, &[1, 2]))
            .await
            .unwrap();
        sink.add_batch(1, Arc::clone(&schema), rows(&schema, &[3]))
            .await
            .unwrap();
        assert_eq!(sink.data().snapshot(), rows(&schema, &[3]));
        assert_eq!(sink.data().latest_batch_id(), Some(1));
    }
}
