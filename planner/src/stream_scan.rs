//! The physical scan of a streaming table: the current micro-batch's rows, marked as streaming
//! so the engine can tell which operators of a physical plan see the stream (and must keep
//! state) from those over static tables.

use std::fmt;
use std::sync::Arc;

use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::error::Result;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, PhysicalExpr,
    PlanProperties,
};

/// Reads one micro-batch of a streaming source: a thin wrapper over the in-memory scan of the
/// batch's rows.
#[derive(Debug)]
pub struct StreamScanExec {
    source: String,
    input: Arc<dyn ExecutionPlan>,
}

impl StreamScanExec {
    /// A scan of stream `source` whose rows `input` produces.
    pub fn new(source: impl Into<String>, input: Arc<dyn ExecutionPlan>) -> Self {
        Self {
            source: source.into(),
            input,
        }
    }

    /// The streaming table's name.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Whether `plan` reads a stream: it is, or has below it, a [`StreamScanExec`].
    pub fn is_below(plan: &Arc<dyn ExecutionPlan>) -> bool {
        plan.is::<StreamScanExec>() || plan.children().into_iter().any(Self::is_below)
    }
}

impl DisplayAs for StreamScanExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "StreamScanExec: source={}", self.source)
    }
}

impl ExecutionPlan for StreamScanExec {
    fn name(&self) -> &str {
        "StreamScanExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        self.input.properties()
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn with_new_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        match children.pop() {
            Some(input) if children.is_empty() => {
                Ok(Arc::new(Self::new(self.source.clone(), input)))
            }
            _ => Err(datafusion::error::DataFusionError::Internal(
                "StreamScanExec has exactly one child".into(),
            )),
        }
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        debug_assert!(partition < self.input.output_partitioning().partition_count());
        self.input.execute(partition, context)
    }
}
