//! Checking every flow of a pipeline without reading or writing data: what `weir pipeline
//! dry-run` reports, and what `weir pipeline run` checks before its first flow starts.
//!
//! ```text
//! per stage, per flow:  plan its query (SQL errors, unknown tables and columns, streaming
//!                       rules: a streaming flow must read a stream, a once flow or a view a
//!                       batch query)
//!                       its checkpoint exists → the restart checks `weir checkpoint validate`
//!                       makes (sources, sink, stateful operators and state schemas), the same
//!                       side-by-side report
//! after a stage:        each dataset it writes is readable by the next stages: the Delta
//!                       table where it exists, else an empty stand-in with the schema the
//!                       flow's query gives (in batch SQL and as STREAM name)
//! ```
//!
//! The checks run in a session of their own, so the stand-ins never reach an update.

use std::sync::Arc;

use datafusion::dataframe::DataFrame;
use weir_common::{Location, Options};
use weir_engine::{Error, Trigger, ValidationReport, WeirSession};
use weir_sources::MemoryStream;

use crate::graph::{FlowKind, Graph};
use crate::run::Layout;

/// What checking one flow found.
#[derive(Debug)]
pub struct FlowCheck {
    /// The flow.
    pub flow: String,
    /// The dataset it writes.
    pub target: String,
    /// Why it cannot run (its query does not plan, or its kind does not fit its query).
    pub error: Option<Error>,
    /// The restart checks against its checkpoint, when it has one.
    pub restart: Option<ValidationReport>,
    /// Not checked: it reads this dataset, whose flows did not pass their checks.
    pub blocked_by: Option<String>,
}

impl FlowCheck {
    /// Whether the flow would start.
    pub fn ok(&self) -> bool {
        self.error.is_none()
            && self.blocked_by.is_none()
            && self.restart.as_ref().is_none_or(|r| r.accepted)
    }
}

/// Checks every flow of `graph`, in stage order, in `session` (a session of its own).
pub async fn check_flows(
    session: &WeirSession,
    layout: &Layout,
    graph: &Graph,
) -> Result<Vec<FlowCheck>, Error> {
    // Existing tables first, so a flow reading one sees its real schema.
    crate::run::register_tables(session, layout, graph).await;
    let mut out = vec![];
    // Datasets a flow into which did not pass: what reads them is not checked.
    let mut failed: std::collections::BTreeSet<String> = Default::default();
    for stage in graph.stages()? {
        crate::run::register_views(session, graph).await;
        let mut schemas = vec![];
        for i in stage {
            let flow = &graph.flows[i];
            let dataset = &graph.datasets[&flow.target.to_ascii_lowercase()];
            let mut check = FlowCheck {
                flow: flow.name.clone(),
                target: flow.target.clone(),
                error: None,
                restart: None,
                blocked_by: flow.reads.iter().find(|r| failed.contains(*r)).cloned(),
            };
            if check.blocked_by.is_some() {
                failed.insert(flow.target.to_ascii_lowercase());
                out.push(check);
                continue;
            }
            if let Err(e) = crate::run::register_time_travel(session, layout, graph, flow).await {
                check.error = Some(e);
                failed.insert(flow.target.to_ascii_lowercase());
                out.push(check);
                continue;
            }
            match crate::run::flow_plan(session, flow).await {
                Err(e) => check.error = Some(e),
                Ok(plan) => {
                    let streaming = weir_planner::is_streaming(&plan);
                    let df = DataFrame::new(session.context().state(), plan);
                    // An AUTO CDC flow's table has its output's columns but the action.
                    let mut schema = df.schema().as_arrow().clone();
                    if flow.auto_cdc.is_some() {
                        schema = arrow::datatypes::Schema::new(
                            schema.fields().iter().skip(1).cloned().collect::<Vec<_>>(),
                        );
                    }
                    schemas.push((dataset.name.clone(), Arc::new(schema)));
                    match (flow.kind, streaming) {
                        (FlowKind::Append, true) => {
                            let checkpoint = layout.checkpoint(&dataset.name, &flow.name);
                            if has_checkpoint(&checkpoint).await {
                                let writer = crate::run::flow_writer(
                                    session,
                                    layout,
                                    dataset,
                                    flow,
                                    df,
                                    Trigger::AvailableNow,
                                );
                                match writer.validate().await {
                                    Ok(report) => check.restart = Some(report),
                                    Err(e) => check.error = Some(e),
                                }
                            }
                        }
                        (FlowKind::Append, false) => {
                            check.error = Some(Error::user(
                                "INVALID_FLOW_QUERY_TYPE.BATCH_RELATION_FOR_STREAMING_TABLE",
                                "42000",
                                format!(
                                    "Flow '{}' into streaming table '{}' reads no stream: read \
                                     its source with STREAM, or make it a once flow (INSERT \
                                     INTO ONCE) or a materialized view.",
                                    flow.name, flow.target
                                ),
                            ))
                        }
                        (FlowKind::Once | FlowKind::Complete, true) => {
                            check.error = Some(Error::user(
                                "INVALID_FLOW_QUERY_TYPE.STREAMING_RELATION_FOR_BATCH_FLOW",
                                "42000",
                                format!(
                                    "Flow '{}' reads a stream, but a {} runs a batch query: \
                                     read the table without STREAM.",
                                    flow.name,
                                    if flow.kind == FlowKind::Once {
                                        "once flow"
                                    } else {
                                        "materialized view"
                                    }
                                ),
                            ))
                        }
                        (FlowKind::Once | FlowKind::Complete, false) => {}
                    }
                }
            }
            if !check.ok() {
                failed.insert(flow.target.to_ascii_lowercase());
            }
            out.push(check);
        }
        // What this stage writes, readable by the next: the table if it exists, else a
        // stand-in with the schema of the first flow that planned.
        for (name, schema) in schemas {
            let d = &graph.datasets[&name.to_ascii_lowercase()];
            let real = session
                .register_delta_table(&name, &layout.table(d), &Options::new())
                .await;
            if real.is_ok() {
                continue;
            }
            let table =
                datafusion::datasource::MemTable::try_new(Arc::clone(&schema), vec![vec![]])?;
            let _ = session.context().deregister_table(name.as_str());
            session
                .context()
                .register_table(name.as_str(), Arc::new(table))?;
            session.register_memory_stream(&MemoryStream::new(name.clone(), schema));
        }
    }
    Ok(out)
}

async fn has_checkpoint(dir: &str) -> bool {
    match Location::parse_existing_with(dir, std::iter::empty::<(&str, &str)>()) {
        Ok(l) => l.exists("metadata").await.unwrap_or(false),
        Err(_) => false,
    }
}
