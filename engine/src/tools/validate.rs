//! `weir checkpoint validate`: would a query restart from a checkpoint? Every restart check
//! [`DataStreamWriter::start`](crate::DataStreamWriter::start) makes, run without executing
//! anything or writing to the checkpoint, with what differs between the two sides.
//!
//! ```text
//! query (SQL or DataFrame) -> planned sources, sink, stateful operators   (the query side)
//! offsets/<newest>, sink, state/_metadata                                 (the checkpoint side)
//!          \__________________ compared ___________________/
//!                               |
//!               ValidationReport: each side by side, the problems, the verdict
//! ```

use std::collections::BTreeMap;
use std::fmt::Write as _;

use std::sync::Arc;

use serde::Serialize;
use uuid::Uuid;

use crate::Error;
use crate::checkpoint::SinkRecord;
use crate::stateful::{OperatorInfo, same_types};
use crate::tools::inspect::ddl;

/// How one item of the query compares with the checkpoint's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Change {
    /// Both sides are the same.
    Same,
    /// Both sides have it, and it differs.
    Changed,
    /// Only the query has it.
    Added,
    /// Only the checkpoint has it.
    Removed,
}

impl Change {
    fn word(self) -> &'static str {
        match self {
            Self::Same => "same",
            Self::Changed => "changed",
            Self::Added => "added",
            Self::Removed => "removed",
        }
    }
}

/// A source, by position.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SourceCheck {
    /// Its position in the query (after the query's sources, those only the checkpoint has).
    pub position: usize,
    /// The name the user gave it.
    pub name: Option<String>,
    /// The identity the checkpoint's newest batch recorded there.
    pub checkpoint: Option<String>,
    /// The identity of the query's source there.
    pub query: Option<String>,
    /// How they compare.
    pub change: Change,
}

/// The sink.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SinkCheck {
    /// The sink the checkpoint's batches were written to.
    pub checkpoint: Option<SinkRecord>,
    /// The query's sink.
    pub query: SinkRecord,
    /// How they compare.
    pub change: Change,
}

/// One side of a stateful operator.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct OperatorSide {
    /// Its ID.
    pub operator_id: u32,
    /// `aggregate`, `dedupe`, ...
    pub operator_name: String,
    /// Its state stores.
    pub store_names: Vec<String>,
    /// The key columns of its state, as Spark DDL.
    pub key_schema: String,
    /// The value columns of its state, as Spark DDL.
    pub value_schema: String,
    /// What gives its state its meaning (grouping expressions, aggregate functions, ...).
    pub definition: Vec<String>,
}

impl From<&OperatorInfo> for OperatorSide {
    fn from(o: &OperatorInfo) -> Self {
        Self {
            operator_id: o.operator_id,
            operator_name: o.operator_name.clone(),
            store_names: o.store_names.clone(),
            key_schema: ddl(&o.key_schema),
            value_schema: ddl(&o.value_schema),
            definition: o.fingerprint.clone(),
        }
    }
}

/// A stateful operator, by position in the plan.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct OperatorCheck {
    /// The checkpoint's operator there.
    pub checkpoint: Option<OperatorSide>,
    /// The query's operator there.
    pub query: Option<OperatorSide>,
    /// How they compare.
    pub change: Change,
    /// What differs: `operator`, `stores`, `key schema`, `value schema`, `definition`.
    pub differences: Vec<String>,
}

/// A setting the checkpoint fixed when it was created.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SettingCheck {
    /// The setting's key.
    pub name: String,
    /// The value logged in the checkpoint (a restart keeps it).
    pub checkpoint: String,
    /// The value the query's session asks for.
    pub query: String,
}

/// A restart check that refuses the query.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Problem {
    /// The error class a restart would fail with.
    pub error_class: String,
    /// Its SQLSTATE.
    pub sql_state: String,
    /// The error's message: what is wrong and what to do.
    pub message: String,
}

impl From<&Error> for Problem {
    fn from(e: &Error) -> Self {
        Self {
            error_class: e.error_class().to_string(),
            sql_state: e.sql_state().to_string(),
            message: e.to_string(),
        }
    }
}

/// What validating a query against a checkpoint found.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ValidationReport {
    /// The checkpoint's location.
    pub location: String,
    /// The checkpoint's query ID.
    pub query_id: Uuid,
    /// Whether a restart of the query from the checkpoint would be accepted.
    pub accepted: bool,
    /// The last committed batch.
    pub last_committed: Option<u64>,
    /// The batch a restart runs first (a pending batch runs again with its logged offsets).
    pub next_batch: u64,
    /// The sources, side by side.
    pub sources: Vec<SourceCheck>,
    /// The sink, side by side.
    pub sink: SinkCheck,
    /// The stateful operators, side by side.
    pub operators: Vec<OperatorCheck>,
    /// Settings whose logged value differs from the session's (the logged value is kept).
    pub settings: Vec<SettingCheck>,
    /// Every check that refuses the query; empty when it is accepted.
    pub problems: Vec<Problem>,
    /// The errors a restart would fail with, one per problem, as a restart reports them.
    #[serde(skip)]
    pub refusals: Vec<Arc<Error>>,
}

/// A source on both sides: name, the checkpoint's identity, the query's identity.
pub(crate) type SourcePair = (Option<String>, Option<Option<String>>, Option<String>);

/// The two sides, and what the restart checks said.
pub(crate) struct Sides<'a> {
    pub(crate) location: String,
    pub(crate) query_id: Uuid,
    pub(crate) last_committed: Option<u64>,
    pub(crate) next_batch: u64,
    /// The sources paired up (by position, or by name with source evolution): the name, the
    /// identity the checkpoint's newest batch recorded (`Some(None)`: present, identity not
    /// recorded), and the query's.
    pub(crate) sources: Vec<SourcePair>,
    pub(crate) sink: (Option<SinkRecord>, SinkRecord),
    pub(crate) operators: (&'a [OperatorInfo], &'a [OperatorInfo]),
    /// Logged settings and the session's values.
    pub(crate) settings: (BTreeMap<String, String>, BTreeMap<String, String>),
    pub(crate) problems: Vec<Error>,
}

fn compare_operators(was: Option<&OperatorInfo>, now: Option<&OperatorInfo>) -> OperatorCheck {
    let mut differences = vec![];
    if let (Some(a), Some(b)) = (was, now) {
        if a.operator_name != b.operator_name {
            differences.push("operator".to_string());
        }
        if a.store_names != b.store_names {
            differences.push("stores".into());
        }
        if !same_types(&a.key_schema, &b.key_schema) {
            differences.push("key schema".into());
        }
        if !same_types(&a.value_schema, &b.value_schema) {
            differences.push("value schema".into());
        }
        if a.fingerprint != b.fingerprint {
            differences.push("definition".into());
        }
    }
    let change = match (was, now) {
        (Some(_), Some(_)) if differences.is_empty() => Change::Same,
        (Some(_), Some(_)) => Change::Changed,
        (None, _) => Change::Added,
        (Some(_), None) => Change::Removed,
    };
    OperatorCheck {
        checkpoint: was.map(OperatorSide::from),
        query: now.map(OperatorSide::from),
        change,
        differences,
    }
}

impl Sides<'_> {
    pub(crate) fn report(self) -> ValidationReport {
        let sources = self
            .sources
            .into_iter()
            .enumerate()
            .map(|(position, (name, was, now))| {
                let change = match (&was, &now) {
                    (Some(Some(a)), Some(b)) if a != b => Change::Changed,
                    // An identity not recorded (an older checkpoint) is not compared.
                    (Some(_), Some(_)) | (None, None) => Change::Same,
                    (None, Some(_)) => Change::Added,
                    (Some(_), None) => Change::Removed,
                };
                SourceCheck {
                    position,
                    name,
                    checkpoint: was.flatten(),
                    query: now,
                    change,
                }
            })
            .collect();
        let (was_sink, now_sink) = self.sink;
        let sink = SinkCheck {
            change: match &was_sink {
                // A checkpoint that never planned a batch has no sink yet.
                None => Change::Same,
                Some(w) if w.same_target(&now_sink) => Change::Same,
                Some(_) => Change::Changed,
            },
            checkpoint: was_sink,
            query: now_sink,
        };
        let (was_ops, now_ops) = self.operators;
        let operators = (0..was_ops.len().max(now_ops.len()))
            .map(|i| compare_operators(was_ops.get(i), now_ops.get(i)))
            .collect();
        let (logged, session) = self.settings;
        let settings = logged
            .iter()
            .filter_map(|(k, v)| {
                let q = session.get(k)?;
                (q != v).then(|| SettingCheck {
                    name: k.clone(),
                    checkpoint: v.clone(),
                    query: q.clone(),
                })
            })
            .collect();
        ValidationReport {
            location: self.location,
            query_id: self.query_id,
            accepted: self.problems.is_empty(),
            last_committed: self.last_committed,
            next_batch: self.next_batch,
            sources,
            sink,
            operators,
            settings,
            problems: self.problems.iter().map(Problem::from).collect(),
            refusals: self.problems.into_iter().map(Arc::new).collect(),
        }
    }
}

fn sink_text(r: Option<&SinkRecord>) -> String {
    match r {
        None => "(none recorded)".into(),
        Some(SinkRecord {
            format,
            identity: Some(i),
            ..
        }) => format!("{format} at {i}"),
        Some(SinkRecord { format, .. }) => format.clone(),
    }
}

/// Reads one item of an operator for the text report.
type Getter = fn(&OperatorSide) -> String;

impl ValidationReport {
    /// The report as text for a terminal.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "checkpoint  {}", self.location);
        let _ = writeln!(out, "query id    {}", self.query_id);
        let _ = writeln!(
            out,
            "batches     last committed {}; a restart runs batch {} next",
            self.last_committed
                .map_or("none".to_string(), |c| c.to_string()),
            self.next_batch
        );
        let verdict = if self.accepted {
            "ACCEPTED: the query can restart from this checkpoint".to_string()
        } else {
            format!(
                "REFUSED: {} restart check(s) fail, listed under problems",
                self.problems.len()
            )
        };
        let _ = writeln!(out, "verdict     {verdict}");

        let _ = writeln!(out, "\nsources");
        if self.sources.is_empty() {
            let _ = writeln!(out, "  (none)");
        }
        for s in &self.sources {
            let side = |x: &Option<String>| x.clone().unwrap_or_else(|| "(none)".into());
            let text = match s.change {
                Change::Same => side(&s.query),
                _ => format!("{} -> {}", side(&s.checkpoint), side(&s.query)),
            };
            let name = s.name.as_ref().map_or(String::new(), |n| format!("'{n}' "));
            let _ = writeln!(
                out,
                "  [{}] {:<8} {name}{text}",
                s.position,
                s.change.word()
            );
        }
        let _ = writeln!(out, "\nsink");
        let text = match self.sink.change {
            Change::Same => sink_text(Some(&self.sink.query)),
            _ => format!(
                "{} -> {}",
                sink_text(self.sink.checkpoint.as_ref()),
                sink_text(Some(&self.sink.query))
            ),
        };
        let _ = writeln!(out, "  {:<12} {text}", self.sink.change.word());

        let _ = writeln!(out, "\nstateful operators");
        if self.operators.is_empty() {
            let _ = writeln!(out, "  (none)");
        }
        for (i, op) in self.operators.iter().enumerate() {
            let name = |x: &Option<OperatorSide>| {
                x.as_ref()
                    .map_or("(none)".to_string(), |o| o.operator_name.clone())
            };
            let head = match op.change {
                Change::Same => name(&op.query),
                Change::Changed => format!("{}: {}", name(&op.query), op.differences.join(", ")),
                _ => format!("{} -> {}", name(&op.checkpoint), name(&op.query)),
            };
            let _ = writeln!(out, "  [{i}] {:<8} {head}", op.change.word());
            let rows: [(&str, Getter); 3] = [
                ("key", |o| o.key_schema.clone()),
                ("value", |o| o.value_schema.clone()),
                ("definition", |o| o.definition.join("; ")),
            ];
            for (label, get) in rows {
                match (&op.checkpoint, &op.query) {
                    (Some(a), Some(b)) if get(a) != get(b) => {
                        let _ = writeln!(out, "      {label:<10} checkpoint: {}", get(a));
                        let _ = writeln!(out, "      {:<10} query:      {}", "", get(b));
                    }
                    (Some(a), _) | (None, Some(a)) => {
                        let v = get(a);
                        let v = if v.is_empty() {
                            "(none)".to_string()
                        } else {
                            v
                        };
                        let _ = writeln!(out, "      {label:<10} {v}");
                    }
                    (None, None) => {}
                }
            }
        }
        if !self.settings.is_empty() {
            let _ = writeln!(
                out,
                "\nsettings fixed by the checkpoint (a restart keeps them)"
            );
            for s in &self.settings {
                let _ = writeln!(
                    out,
                    "  {} = {} (this session: {})",
                    s.name, s.checkpoint, s.query
                );
            }
        }
        if !self.problems.is_empty() {
            let _ = writeln!(out, "\nproblems");
            for (i, p) in self.problems.iter().enumerate() {
                let _ = writeln!(out, "  {}. {}", i + 1, p.message);
            }
        }
        out
    }
}
