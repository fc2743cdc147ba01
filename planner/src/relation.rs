//! Planning streaming relations in SQL: `STREAM rate(rowsPerSecond => 10)`,
//! `STREAM(rate_micro_batch(rowsPerBatch => 5))`, `rate(...)` (a source format is always a
//! stream) and `STREAM events` (a stream registered by name, e.g. a memory stream).

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use datafusion::common::DataFusionError;
use datafusion::datasource::provider_as_source;
use datafusion::error::Result;
use datafusion::logical_expr::LogicalPlanBuilder;
use datafusion::logical_expr::planner::{
    PlannedRelation, RelationPlanner, RelationPlannerContext, RelationPlanning,
};
use datafusion::sql::sqlparser::ast::{
    Expr as SqlExpr, FunctionArg, FunctionArgExpr, FunctionArguments, ObjectName, TableAlias,
    TableFactor, UnaryOperator, Value,
};
use weir_common::{ClassifiedError, Options};
use weir_sources::{SourceProvider, SourceRegistry};

use crate::StreamingTable;
use crate::watermark::with_watermark;

/// The streams a session knows: source formats by name and streams registered by name.
#[derive(Debug, Default)]
pub struct StreamCatalog {
    formats: RwLock<SourceRegistry>,
    named: RwLock<BTreeMap<String, Arc<dyn SourceProvider>>>,
}

fn user(e: ClassifiedError) -> DataFusionError {
    DataFusionError::External(Box::new(e))
}

fn source_err(e: weir_sources::Error) -> DataFusionError {
    DataFusionError::External(Box::new(e))
}

impl StreamCatalog {
    /// A catalog with the formats of `registry` and no named streams.
    pub fn new(registry: SourceRegistry) -> Self {
        Self {
            formats: RwLock::new(registry),
            named: RwLock::new(BTreeMap::new()),
        }
    }

    /// Registers `source` under `name` (case-insensitive), readable as `STREAM name`.
    pub fn register_stream(&self, name: &str, source: Arc<dyn SourceProvider>) {
        if let Ok(mut named) = self.named.write() {
            named.insert(name.to_ascii_lowercase(), source);
        }
    }

    /// The stream registered under `name`.
    pub fn stream(&self, name: &str) -> Option<Arc<dyn SourceProvider>> {
        self.named
            .read()
            .ok()?
            .get(&name.to_ascii_lowercase())
            .cloned()
    }

    /// Whether `name` is a source format (`rate`, `rate_micro_batch`, ...).
    pub fn is_format(&self, name: &str) -> bool {
        self.formats.read().is_ok_and(|f| f.contains(name))
    }

    /// Creates a source of `format` with `options`.
    pub fn create_source(
        &self,
        format: &str,
        options: &Options,
    ) -> weir_sources::Result<Arc<dyn SourceProvider>> {
        let formats = self.formats.read().map_err(|_| {
            ClassifiedError::new("INTERNAL_ERROR", "XX000", "source registry lock poisoned")
        })?;
        formats.create(format, options)
    }

    /// Adds a source format.
    pub fn register_format(&self, name: &str, factory: weir_sources::SourceFactory) {
        if let Ok(mut f) = self.formats.write() {
            f.register(name, factory);
        }
    }
}

/// The DataFusion relation planner for streaming relations.
#[derive(Debug)]
pub struct StreamRelationPlanner {
    catalog: Arc<StreamCatalog>,
}

impl StreamRelationPlanner {
    /// A planner resolving streams in `catalog`.
    pub fn new(catalog: Arc<StreamCatalog>) -> Self {
        Self { catalog }
    }

    fn planned(
        &self,
        name: &str,
        source: Arc<dyn SourceProvider>,
        alias: Option<TableAlias>,
        source_name: Option<&str>,
    ) -> Result<RelationPlanning> {
        let mut table = StreamingTable::new(name, source);
        if let Some(n) = source_name {
            crate::table::check_source_name(n).map_err(user)?;
            table = table.with_source_name(n);
        }
        let plan =
            LogicalPlanBuilder::scan(name, provider_as_source(Arc::new(table)), None)?.build()?;
        Ok(RelationPlanning::Planned(Box::new(PlannedRelation::new(
            plan, alias,
        ))))
    }

    fn plan_source_call(
        &self,
        format: &str,
        args: &[FunctionArg],
        alias: Option<TableAlias>,
        source_name: Option<&str>,
    ) -> Result<RelationPlanning> {
        let options = options_from_args(format, args).map_err(user)?;
        let source = self
            .catalog
            .create_source(format, &options)
            .map_err(source_err)?;
        self.planned(format, source, alias, source_name)
    }

    fn plan_named(
        &self,
        name: &str,
        alias: Option<TableAlias>,
        source_name: Option<&str>,
    ) -> Result<RelationPlanning> {
        match self.catalog.stream(name) {
            Some(source) => self.planned(name, source, alias, source_name),
            None => Err(user(ClassifiedError::new(
                "STREAM_NOT_FOUND",
                "42P01",
                format!(
                    "There is no stream named '{name}'. Register one first (e.g. a memory \
                     stream from Rust), or read a source format: STREAM rate(rowsPerSecond => 10)."
                ),
            ))),
        }
    }
}

/// The last part of a relation's name (`read_state` of `x.read_state`), as written.
pub fn last_name(name: &ObjectName) -> String {
    name.0
        .last()
        .and_then(|p| p.as_ident())
        .map(|i| i.value.clone())
        .unwrap_or_default()
}

impl RelationPlanner for StreamRelationPlanner {
    fn plan_relation(
        &self,
        relation: TableFactor,
        _ctx: &mut dyn RelationPlannerContext,
    ) -> Result<RelationPlanning> {
        let TableFactor::Table {
            name,
            args: Some(args),
            alias,
            ..
        } = &relation
        else {
            return Ok(RelationPlanning::Original(Box::new(relation)));
        };
        let fname = last_name(name);
        if fname.eq_ignore_ascii_case("stream") {
            let (source_args, source_name) = split_source_name(&args.args);
            let (source_args, watermark) = split_watermark(&source_args).map_err(user)?;
            let source_name = source_name.as_deref();
            let planned = match source_args.as_slice() {
                [FunctionArg::Unnamed(FunctionArgExpr::Expr(expr))] => match expr {
                    SqlExpr::Function(f) => {
                        let inner_args = match &f.args {
                            FunctionArguments::List(list) => list.args.clone(),
                            FunctionArguments::None => vec![],
                            FunctionArguments::Subquery(_) => {
                                return Err(user(ClassifiedError::new(
                                    "INVALID_STREAM_RELATION",
                                    "42601",
                                    "STREAM takes a source call or a stream name, not a subquery.",
                                )));
                            }
                        };
                        self.plan_source_call(
                            &last_name(&f.name),
                            &inner_args,
                            alias.clone(),
                            source_name,
                        )
                    }
                    SqlExpr::Identifier(id) => {
                        self.plan_named(&id.value, alias.clone(), source_name)
                    }
                    SqlExpr::CompoundIdentifier(ids) => {
                        let id = ids.last().map(|i| i.value.clone()).unwrap_or_default();
                        self.plan_named(&id, alias.clone(), source_name)
                    }
                    other => Err(user(ClassifiedError::new(
                        "INVALID_STREAM_RELATION",
                        "42601",
                        format!(
                            "STREAM takes a source call such as rate(rowsPerSecond => 10) or a \
                             stream name, not '{other}'."
                        ),
                    ))),
                },
                _ => Err(user(ClassifiedError::new(
                    "INVALID_STREAM_RELATION",
                    "42601",
                    "STREAM takes exactly one source call or stream name (and optionally \
                     watermark => 'column', delay => '10 seconds').",
                ))),
            }?;
            return match (planned, watermark) {
                (RelationPlanning::Planned(p), Some((column, delay))) => {
                    let PlannedRelation { plan, alias } = *p;
                    let plan = with_watermark(plan, &column, &delay).map_err(user)?;
                    Ok(RelationPlanning::Planned(Box::new(PlannedRelation::new(
                        plan, alias,
                    ))))
                }
                (planned, _) => Ok(planned),
            };
        }
        if self.catalog.is_format(&fname) {
            return self.plan_source_call(&fname, &args.args, alias.clone(), None);
        }
        Ok(RelationPlanning::Original(Box::new(relation)))
    }
}

/// Takes the source's name out of `STREAM(source, name => 'orders_us', ...)`.
fn split_source_name(args: &[FunctionArg]) -> (Vec<FunctionArg>, Option<String>) {
    let mut rest = vec![];
    let mut name = None;
    for a in args {
        match a {
            FunctionArg::Named {
                name: n,
                arg: FunctionArgExpr::Expr(e),
                ..
            } if n.value.eq_ignore_ascii_case("name") => name = Some(literal_text(e)),
            other => rest.push(other.clone()),
        }
    }
    (rest, name)
}

/// Splits `STREAM(source, watermark => 'col', delay => '10 seconds')` into the source argument
/// and the watermark, if any.
#[expect(clippy::type_complexity, reason = "a local helper's pair")]
fn split_watermark(
    args: &[FunctionArg],
) -> Result<(Vec<FunctionArg>, Option<(String, String)>), ClassifiedError> {
    let mut rest = vec![];
    let (mut column, mut delay) = (None, None);
    for a in args {
        match a {
            FunctionArg::Named {
                name,
                arg: FunctionArgExpr::Expr(e),
                ..
            } if name.value.eq_ignore_ascii_case("watermark") => {
                column = Some(literal_text(e));
            }
            FunctionArg::Named {
                name,
                arg: FunctionArgExpr::Expr(e),
                ..
            } if name.value.eq_ignore_ascii_case("delay") => {
                delay = Some(literal_text(e));
            }
            other => rest.push(other.clone()),
        }
    }
    match (column, delay) {
        (Some(c), Some(d)) => Ok((rest, Some((c, d)))),
        (None, None) => Ok((rest, None)),
        _ => Err(ClassifiedError::new(
            "INVALID_WATERMARK",
            "42K0E",
            "A watermark needs both a column and a delay: STREAM(source, watermark => \
             'column', delay => '10 seconds'), or FROM STREAM source WATERMARK column DELAY OF \
             INTERVAL 10 SECONDS.",
        )),
    }
}

/// Turns `rate(rowsPerSecond => 10, rampUpTime => '5 seconds')` arguments into options; a
/// first argument without a name is the `path` option.
fn options_from_args(format: &str, args: &[FunctionArg]) -> Result<Options, ClassifiedError> {
    let mut options = Options::new();
    for (i, arg) in args.iter().enumerate() {
        let (name, value) = match arg {
            // read_files('/data/in', format => 'json'): a leading unnamed value is the path.
            FunctionArg::Unnamed(FunctionArgExpr::Expr(e)) if i == 0 => ("path".to_string(), e),
            FunctionArg::Named {
                name,
                arg: FunctionArgExpr::Expr(e),
                ..
            } => (name.value.clone(), e),
            FunctionArg::ExprNamed {
                name: SqlExpr::Identifier(name),
                arg: FunctionArgExpr::Expr(e),
                ..
            } => (name.value.clone(), e),
            other => {
                return Err(ClassifiedError::invalid_option(format!(
                    "Options of the {format} source are named: write {format}(option => value, ...), \
                     not '{other}'."
                )));
            }
        };
        if let Err(first) = options.insert_new(name.clone(), literal_text(value)) {
            return Err(ClassifiedError::new(
                "DUPLICATE_ROUTINE_PARAMETER_ASSIGNMENT.DOUBLE_NAMED_ARGUMENT_REFERENCE",
                "4274K",
                format!(
                    "The option '{name}' of the {format} source is given twice (as '{first}' \
                     and '{name}'; option names ignore case). Give each option once."
                ),
            ));
        }
    }
    Ok(options)
}

/// The text of an option value: numbers and booleans as written, strings without quotes.
fn literal_text(e: &SqlExpr) -> String {
    match e {
        SqlExpr::Value(v) => match &v.value {
            Value::SingleQuotedString(s) | Value::DoubleQuotedString(s) => s.clone(),
            Value::Number(n, _) => n.to_string(),
            Value::Boolean(b) => b.to_string(),
            other => other.to_string(),
        },
        SqlExpr::UnaryOp {
            op: UnaryOperator::Minus,
            expr,
        } => format!("-{}", literal_text(expr)),
        SqlExpr::Identifier(id) => id.value.clone(),
        other => other.to_string().replace('\'', ""),
    }
}
