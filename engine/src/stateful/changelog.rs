//! The physical form of the planner's `Changelog` node: a streaming aggregation that emits,
//! for each group a batch changed, its old row (weight -1) and its new one (+1), so an
//! aggregation above it can take back what the old row added (see
//! `weir_planner::changelog`).
//!
//! ```text
//! ChangelogExec                       at planning: a marker over DataFusion's aggregate
//!   AggregateExec(Final) ...     ─►   StatefulExec<StreamingAggregate> (changelog), in `rewrite`
//! ```

use std::fmt;
use std::sync::Arc;

use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::EquivalenceProperties;
use datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PhysicalExpr, PlanProperties,
};
use weir_planner::changelog::WEIGHT_COLUMN;

/// A streaming aggregation's output as a changelog: its columns and the weight.
#[derive(Debug)]
pub(crate) struct ChangelogExec {
    input: Arc<dyn ExecutionPlan>,
    properties: Arc<PlanProperties>,
}

/// `schema` and the weight column.
pub(crate) fn with_weight(schema: &Schema) -> SchemaRef {
    let mut fields: Vec<Arc<Field>> = schema.fields().iter().cloned().collect();
    fields.push(Arc::new(Field::new(WEIGHT_COLUMN, DataType::Int64, false)));
    Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone()))
}

impl ChangelogExec {
    /// The changelog of `input`, DataFusion's plan of an aggregation.
    pub(crate) fn new(input: Arc<dyn ExecutionPlan>) -> Self {
        let schema = with_weight(&input.schema());
        let properties = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(Arc::clone(&schema)),
            Partitioning::UnknownPartitioning(1),
            EmissionType::Final,
            Boundedness::Bounded,
        ));
        Self { input, properties }
    }

    /// DataFusion's aggregate (not the partial one) that the changelog is of: the input, or
    /// below it through nodes of one child (repartitions, coalesces).
    pub(crate) fn aggregate(&self) -> Result<&AggregateExec> {
        let mut node = &self.input;
        loop {
            if let Some(agg) = node.downcast_ref::<AggregateExec>()
                && !matches!(
                    agg.mode(),
                    AggregateMode::Partial | AggregateMode::PartialReduce
                )
            {
                return Ok(agg);
            }
            match node.children().as_slice() {
                [only] => node = only,
                _ => {
                    return Err(DataFusionError::Internal(format!(
                        "a changelog is not over an aggregation: {}",
                        datafusion::physical_plan::displayable(self.input.as_ref()).one_line()
                    )));
                }
            }
        }
    }
}

impl DisplayAs for ChangelogExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ChangelogExec: {WEIGHT_COLUMN}")
    }
}

impl ExecutionPlan for ChangelogExec {
    fn name(&self) -> &str {
        "ChangelogExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        match children.pop() {
            Some(input) if children.is_empty() => Ok(Arc::new(Self::new(input))),
            _ => Err(DataFusionError::Internal(
                "a changelog has one input".into(),
            )),
        }
    }

    fn execute(
        &self,
        _partition: usize,
        _context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        Err(DataFusionError::Internal(
            "a changelog runs only inside a streaming query's batch".into(),
        ))
    }
}
