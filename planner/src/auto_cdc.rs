//! AUTO CDC (Databricks' `AUTO CDC INTO`, Spark 4.3's AutoCDC): a logical node that turns a
//! stream of change records into the changes of a keyed target table, SCD type 1 (the latest
//! change per key) or type 2 (every version of a key, with `__START_AT` / `__END_AT`). The
//! rules it follows, with their sources, are in `../shared/reference/auto-cdc.md`; the engine
//! plans it as a stateful operator (`engine/src/stateful/auto_cdc.rs`).
//!
//! ```text
//! input    the source's columns, then three the pipeline computes from the flow's clauses:
//!          __weir_cdc_sequence (SEQUENCE BY), __weir_cdc_delete (APPLY AS DELETE WHEN, null
//!          = false), __weir_cdc_truncate (APPLY AS TRUNCATE WHEN, null = false)
//! output   __weir_cdc_action, then the target's columns, then SCD 1: __weir_cdc_sequence (the
//!          row's winning sequence), SCD 2: __START_AT, __END_AT:
//!            action 0  insert this row (an SCD 2 version)
//!            action 1  delete every row of this key (only the key columns are set) unless the
//!                      target's row is newer
//!            action 2  upsert this row by its key (SCD 1) unless the target's row is newer
//!            action 3  truncate: delete every row below this sequence (SCD 1; no key)
//! ```
//!
//! The Delta sink applies each batch's output as one MERGE on the key columns. An SCD 1
//! target keeps `__weir_cdc_sequence` (as Spark's keeps `__spark_autocdc_metadata`), so that
//! several AUTO CDC flows into one table (a snapshot and a change feed) order their changes by
//! sequence there too; weir's readers hide it.

use std::fmt;
use std::sync::Arc;

use arrow::datatypes::{DataType, Field};
use datafusion::common::{DFSchema, DFSchemaRef, Result, plan_err};
use datafusion::logical_expr::{Expr, Extension, LogicalPlan, UserDefinedLogicalNodeCore};
use weir_common::ClassifiedError;

use crate::pipeline::ColumnSelection;

/// The input column holding each change's `SEQUENCE BY` value.
pub const SEQUENCE: &str = "__weir_cdc_sequence";
/// The input column saying a change is a delete.
pub const DELETE: &str = "__weir_cdc_delete";
/// The input column saying a change is a truncate.
pub const TRUNCATE: &str = "__weir_cdc_truncate";
/// The output column saying what to do with a row.
pub const ACTION: &str = "__weir_cdc_action";
/// SCD type 2: where a version starts (the sequence value of its first change).
pub const START_AT: &str = "__START_AT";
/// SCD type 2: where a version ends (null while it is current).
pub const END_AT: &str = "__END_AT";

/// Output action: insert the row.
pub const ACTION_INSERT: i8 = 0;
/// Output action: delete every target row of the row's key.
pub const ACTION_DELETE_KEY: i8 = 1;
/// Output action: replace the target row of the row's key, or insert it.
pub const ACTION_UPSERT: i8 = 2;
/// Output action: delete every target row whose sequence is below the row's.
pub const ACTION_TRUNCATE: i8 = 3;
/// Columns of a target table that only AUTO CDC reads start with this.
pub const HIDDEN_PREFIX: &str = "__weir_cdc_";

/// Databricks' `pipelines.cdc.tombstoneGCThresholdInSeconds` when the pipeline does not set
/// it: two days (the default is not documented; see the README).
pub const DEFAULT_TOMBSTONE_TTL_MS: i64 = 2 * 24 * 3600 * 1000;

/// What an AUTO CDC flow asks for, as its statement says it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AutoCdcOptions {
    /// `KEYS (...)`.
    pub keys: Vec<String>,
    /// `COLUMNS ...`.
    pub columns: ColumnSelection,
    /// `STORED AS SCD TYPE 1 | 2`.
    pub scd_type: u8,
    /// `TRACK HISTORY ON ...`.
    pub track_history: ColumnSelection,
    /// Whether the flow has `APPLY AS TRUNCATE WHEN`.
    pub truncates: bool,
    /// How long a delete is remembered (wall-clock milliseconds).
    pub tombstone_ttl_ms: i64,
}

/// The query an AUTO CDC flow reads its changes with: the source's columns, then
/// `__weir_cdc_sequence` (SEQUENCE BY), `__weir_cdc_delete` and `__weir_cdc_truncate` (the
/// APPLY AS conditions, a null condition counting as false: R2).
pub fn auto_cdc_input(f: &crate::pipeline::CreateAutoCdcFlow) -> String {
    let condition = |c: &Option<String>| match c {
        Some(c) => format!("COALESCE(({c}), false)"),
        None => "false".into(),
    };
    format!(
        "SELECT *, ({}) AS {SEQUENCE}, {} AS {DELETE}, {} AS {TRUNCATE} FROM {}",
        f.sequence_by,
        condition(&f.delete_when),
        condition(&f.truncate_when),
        f.source
    )
}

impl AutoCdcOptions {
    /// What flow `f` asks for, deletes remembered for `tombstone_ttl_ms`.
    pub fn of(f: &crate::pipeline::CreateAutoCdcFlow, tombstone_ttl_ms: i64) -> Self {
        Self {
            keys: f.keys.clone(),
            columns: f.columns.clone(),
            scd_type: f.scd_type,
            track_history: f.track_history.clone(),
            truncates: f.truncate_when.is_some(),
            tombstone_ttl_ms,
        }
    }
}

/// The stream of changes `input` applied to a keyed table (see the module's documentation).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AutoCdcNode {
    /// The changes, with the three computed columns.
    pub input: LogicalPlan,
    /// The key columns (names of `input`).
    pub keys: Vec<String>,
    /// The target's columns, in the source's order (the keys among them).
    pub columns: Vec<String>,
    /// SCD type 2: the columns whose change opens a new version.
    pub tracked: Vec<String>,
    /// 1 or 2.
    pub scd_type: u8,
    /// How long a delete is remembered (SCD 1).
    pub tombstone_ttl_ms: i64,
    schema: DFSchemaRef,
}

impl PartialOrd for AutoCdcNode {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        (&self.input, &self.keys, &self.columns, &self.tracked).partial_cmp(&(
            &other.input,
            &other.keys,
            &other.columns,
            &other.tracked,
        ))
    }
}

impl AutoCdcNode {
    /// The node of `plan`, if it is one.
    pub fn of(plan: &LogicalPlan) -> Option<&AutoCdcNode> {
        match plan {
            LogicalPlan::Extension(e) => e.node.as_any().downcast_ref::<AutoCdcNode>(),
            _ => None,
        }
    }
}

impl UserDefinedLogicalNodeCore for AutoCdcNode {
    fn name(&self) -> &str {
        "AutoCdc"
    }

    fn inputs(&self) -> Vec<&LogicalPlan> {
        vec![&self.input]
    }

    fn schema(&self) -> &DFSchemaRef {
        &self.schema
    }

    fn expressions(&self) -> Vec<Expr> {
        vec![]
    }

    fn fmt_for_explain(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "AutoCdc: scd_type={} keys=[{}]",
            self.scd_type,
            self.keys.join(", ")
        )
    }

    fn with_exprs_and_inputs(
        &self,
        _exprs: Vec<Expr>,
        mut inputs: Vec<LogicalPlan>,
    ) -> Result<Self> {
        let Some(input) = inputs.pop() else {
            return plan_err!("AutoCdc takes one input");
        };
        Ok(Self {
            input,
            ..self.clone()
        })
    }
}

fn invalid(message: String) -> ClassifiedError {
    ClassifiedError::new("INVALID_AUTO_CDC_FLOW", "42K06", message)
}

/// The AUTO CDC node over `input` (the source's columns and the three computed ones), its
/// columns resolved against the source's: keys, the target's columns and the tracked ones
/// must name source columns (case-insensitively, as Spark resolves them).
pub fn auto_cdc(
    input: LogicalPlan,
    options: &AutoCdcOptions,
) -> std::result::Result<LogicalPlan, ClassifiedError> {
    let fields: Vec<&Field> = input.schema().fields().iter().map(|f| f.as_ref()).collect();
    for c in [SEQUENCE, DELETE, TRUNCATE] {
        if !fields.iter().any(|f| f.name() == c) {
            return Err(invalid(format!(
                "The AUTO CDC input lacks its computed column '{c}'."
            )));
        }
    }
    let source: Vec<&Field> = fields
        .into_iter()
        .filter(|f| ![SEQUENCE, DELETE, TRUNCATE].contains(&f.name().as_str()))
        .collect();
    let names = || {
        source
            .iter()
            .map(|f| f.name().as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let resolve = |name: &str, what: &str| -> std::result::Result<String, ClassifiedError> {
        if let Some(f) = source.iter().find(|f| f.name() == name) {
            return Ok(f.name().clone());
        }
        let mut matches = source
            .iter()
            .filter(|f| f.name().eq_ignore_ascii_case(name));
        match (matches.next(), matches.next()) {
            (Some(f), None) => Ok(f.name().clone()),
            _ => Err(ClassifiedError::new(
                "UNRESOLVED_COLUMN.WITH_SUGGESTION",
                "42703",
                format!(
                    "The AUTO CDC flow's {what} '{name}' is not a column of its source, which \
                     has: {}.",
                    names()
                ),
            )),
        }
    };
    if options.keys.is_empty() {
        return Err(invalid("An AUTO CDC flow needs KEYS (k, ...).".into()));
    }
    let keys = options
        .keys
        .iter()
        .map(|k| resolve(k, "key"))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let all: Vec<String> = source.iter().map(|f| f.name().clone()).collect();
    let columns: Vec<String> = match &options.columns {
        ColumnSelection::All => all.clone(),
        ColumnSelection::Only(only) => {
            let only = only
                .iter()
                .map(|c| resolve(c, "column"))
                .collect::<std::result::Result<Vec<_>, _>>()?;
            all.iter().filter(|c| only.contains(c)).cloned().collect()
        }
        ColumnSelection::AllExcept(except) => {
            let except = except
                .iter()
                .map(|c| resolve(c, "excepted column"))
                .collect::<std::result::Result<Vec<_>, _>>()?;
            all.iter()
                .filter(|c| !except.contains(c))
                .cloned()
                .collect()
        }
    };
    for k in &keys {
        if !columns.contains(k) {
            return Err(invalid(format!(
                "The key column '{k}' is left out of the target's COLUMNS: the target keeps its \
                 keys. Add it to COLUMNS, or take it out of EXCEPT."
            )));
        }
    }
    for reserved in [START_AT, END_AT, ACTION] {
        if columns.iter().any(|c| c.eq_ignore_ascii_case(reserved)) {
            return Err(invalid(format!(
                "The source has a column '{reserved}', a name AUTO CDC keeps for itself: rename \
                 it, or leave it out with COLUMNS * EXCEPT ({reserved})."
            )));
        }
    }
    if options.scd_type == 1 && options.track_history != ColumnSelection::All {
        return Err(invalid(
            "TRACK HISTORY ON is for SCD type 2 (STORED AS SCD TYPE 2): an SCD type 1 table \
             keeps no history."
                .into(),
        ));
    }
    if options.scd_type == 2 && options.truncates {
        return Err(invalid(
            "APPLY AS TRUNCATE WHEN is supported only for SCD type 1, as in Databricks: an SCD \
             type 2 table keeps its history. Remove the clause, or store the table as SCD TYPE 1."
                .into(),
        ));
    }
    let data: Vec<String> = columns
        .iter()
        .filter(|c| !keys.contains(c))
        .cloned()
        .collect();
    let tracked = match &options.track_history {
        ColumnSelection::All => data.clone(),
        ColumnSelection::Only(only) => {
            let only = only
                .iter()
                .map(|c| resolve(c, "tracked column"))
                .collect::<std::result::Result<Vec<_>, _>>()?;
            data.iter().filter(|c| only.contains(c)).cloned().collect()
        }
        ColumnSelection::AllExcept(except) => {
            let except = except
                .iter()
                .map(|c| resolve(c, "untracked column"))
                .collect::<std::result::Result<Vec<_>, _>>()?;
            data.iter()
                .filter(|c| !except.contains(c))
                .cloned()
                .collect()
        }
    };
    let field = |name: &str| {
        source
            .iter()
            .find(|f| f.name() == name)
            .map(|f| f.as_ref().clone().with_nullable(true))
    };
    let mut out = vec![Field::new(ACTION, DataType::Int8, false)];
    out.extend(columns.iter().filter_map(|c| field(c)));
    let sequence = input
        .schema()
        .field_with_unqualified_name(SEQUENCE)
        .map_err(|e| invalid(e.to_string()))?
        .data_type()
        .clone();
    if options.scd_type == 2 {
        out.push(Field::new(START_AT, sequence.clone(), true));
        out.push(Field::new(END_AT, sequence, true));
    } else {
        out.push(Field::new(SEQUENCE, sequence, true));
    }
    let schema = DFSchema::from_unqualified_fields(out.into(), Default::default())
        .map_err(|e| invalid(e.to_string()))?;
    Ok(LogicalPlan::Extension(Extension {
        node: Arc::new(AutoCdcNode {
            input,
            keys,
            columns,
            tracked,
            scd_type: options.scd_type,
            tombstone_ttl_ms: options.tombstone_ttl_ms,
            schema: Arc::new(schema),
        }),
    }))
}
