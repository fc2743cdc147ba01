//! What the checkpoint records about each stateful operator (`state/_metadata/v1`), and the
//! restart check of a query's operators against it (DESIGN.md §6).

use arrow::datatypes::{DataType, Field, Schema};
use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// One stateful operator as planned: enough to tell, on restart, whether its state still
/// means what the query now asks of it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct OperatorInfo {
    /// Position in the physical plan's top-down order.
    pub(crate) operator_id: u32,
    /// `aggregate`, `dedupe`, ...
    pub(crate) operator_name: String,
    /// Shuffle partitions (one store instance per partition and store name).
    pub(crate) num_partitions: usize,
    /// The operator's stores.
    pub(crate) store_names: Vec<String>,
    /// The key columns of its state.
    pub(crate) key_schema: Schema,
    /// The value columns of its state.
    pub(crate) value_schema: Schema,
    /// What gives the state its meaning, one line per item (grouping expressions, aggregate
    /// functions, ...), with column positions left out so that a projection change does not
    /// count.
    pub(crate) fingerprint: Vec<String>,
    /// Where its state lives, when a checkpoint reset moved it (see [`StateLayout`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) layout: Option<StateLayout>,
}

/// Where an operator's state lives when a checkpoint reset changed it: a kept operator whose
/// position in the plan moved keeps its folder, and a reset operator gets a new, empty folder
/// whose state starts at the reset's batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct StateLayout {
    /// The ID its stores are kept under (`state/<stateId>/...`).
    pub(crate) state_id: u32,
    /// The first batch of its state: batch N reads state version N - base (version 0, empty,
    /// for the first).
    pub(crate) base_batch: u64,
}

impl OperatorInfo {
    /// Holds an operator's ID while the operators below it are planned.
    pub(crate) fn placeholder() -> Self {
        Self {
            operator_id: 0,
            operator_name: String::new(),
            num_partitions: 0,
            store_names: vec![],
            key_schema: Schema::empty(),
            value_schema: Schema::empty(),
            fingerprint: vec![],
            layout: None,
        }
    }

    /// The ID its stores are kept under.
    pub(crate) fn state_id(&self) -> u32 {
        self.layout.map_or(self.operator_id, |l| l.state_id)
    }

    /// The state version batch `batch` reads (and `batch + 1` is what it commits).
    pub(crate) fn state_version(&self, batch: u64) -> u64 {
        batch.saturating_sub(self.layout.map_or(0, |l| l.base_batch))
    }

    /// Whether `other` keeps state of the same meaning and shape: a reset keeps such an
    /// operator's state.
    pub(crate) fn same_state_as(&self, other: &Self) -> bool {
        self.operator_name == other.operator_name
            && self.store_names == other.store_names
            && self.num_partitions == other.num_partitions
            && same_types(&self.key_schema, &other.key_schema)
            && same_types(&self.value_schema, &other.value_schema)
            && self.fingerprint == other.fingerprint
    }
}

/// The checkpoint's record of the query's stateful operators, written before the first batch
/// that uses state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct StateMetadata {
    pub(crate) operators: Vec<OperatorInfo>,
}

/// Types only: a renamed column or a changed nullability keeps the bytes' meaning, as Spark's
/// schema compatibility check.
pub(crate) fn same_types(a: &Schema, b: &Schema) -> bool {
    fn same(a: &DataType, b: &DataType) -> bool {
        match (a, b) {
            (DataType::Struct(x), DataType::Struct(y)) => {
                x.len() == y.len()
                    && x.iter()
                        .zip(y.iter())
                        .all(|(f, g)| same(f.data_type(), g.data_type()))
            }
            (DataType::List(x), DataType::List(y))
            | (DataType::LargeList(x), DataType::LargeList(y)) => {
                same(x.data_type(), y.data_type())
            }
            _ => a == b,
        }
    }
    a.fields().len() == b.fields().len()
        && a.fields()
            .iter()
            .zip(b.fields().iter())
            .all(|(f, g)| same(f.data_type(), g.data_type()))
}

fn describe_schema(s: &Schema) -> String {
    let fields: Vec<String> = s.fields().iter().map(|f| describe_field(f)).collect();
    format!("({})", fields.join(", "))
}

fn describe_field(f: &Field) -> String {
    format!("{}: {}", f.name(), f.data_type())
}

fn describe_ops(ops: &[OperatorInfo]) -> String {
    if ops.is_empty() {
        return "none".into();
    }
    ops.iter()
        .map(|o| format!("{} {}", o.operator_id, o.operator_name))
        .collect::<Vec<_>>()
        .join(", ")
}

const FORMAT_VERSION: u32 = crate::checkpoint::log::LOG_VERSION;

impl StateMetadata {
    /// The file's content: a version line, then the JSON.
    pub(crate) fn encode(&self) -> String {
        crate::checkpoint::log::seal(format!(
            "v{FORMAT_VERSION}\n{}",
            serde_json::to_string(self).unwrap_or_default()
        ))
    }

    /// Reads [`StateMetadata::encode`]'s output; the error says what is wrong.
    pub(crate) fn decode(bytes: &[u8]) -> std::result::Result<Self, String> {
        let text = std::str::from_utf8(bytes).map_err(|_| "is not UTF-8 text".to_string())?;
        let mut lines = crate::checkpoint::log::checked_lines(text)?;
        let json = lines
            .next()
            .ok_or("has no operator list after its version line")?;
        serde_json::from_str(json).map_err(|e| format!("has a damaged operator list ({e})"))
    }
}

const RECOVERY: &str = "Undo the change, or start the changed query with a new checkpoint \
                        location (its state starts empty).";

impl StateMetadata {
    /// Refuses `now` (the operators the query plans today) when the checkpoint's state cannot
    /// serve it. With `allow_fingerprint_change`, operators whose state has the same shape but
    /// another meaning (a different grouping expression or aggregate function of the same
    /// types) are accepted: the user has said the old state still fits.
    pub(crate) fn check(&self, now: &[OperatorInfo], allow_fingerprint_change: bool) -> Result<()> {
        let was = &self.operators;
        let names_match = was.len() == now.len()
            && was
                .iter()
                .zip(now)
                .all(|(a, b)| a.operator_name == b.operator_name);
        if !names_match {
            return Err(Error::user(
                "STREAMING_STATEFUL_OPERATOR_NOT_MATCH_IN_STATE_METADATA",
                "42K03",
                format!(
                    "The query's stateful operators do not match the checkpoint's: the \
                     checkpoint has [{}], the query now has [{}]. A stateful operator was added, \
                     removed or replaced, so its state would be read by the wrong operator. \
                     {RECOVERY}",
                    describe_ops(was),
                    describe_ops(now)
                ),
            ));
        }
        for (a, b) in was.iter().zip(now) {
            let op = format!("operator {} ({})", a.operator_id, a.operator_name);
            if a.store_names != b.store_names {
                return Err(Error::user(
                    "STATE_STORE_LAYOUT_NOT_COMPATIBLE",
                    "XXKST",
                    format!(
                        "The state of {op} was written in another layout, as the stores [{}]; \
                         this weir keeps it as [{}] and cannot read the old one. Start the \
                         query with a new checkpoint location (its state starts empty), or \
                         keep running it with the weir release that wrote the checkpoint.",
                        a.store_names.join(", "),
                        b.store_names.join(", ")
                    ),
                ));
            }
            if !same_types(&a.key_schema, &b.key_schema) {
                return Err(Error::user(
                    "STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE",
                    "XXKST",
                    format!(
                        "The state key of {op} was {} and is now {}: the stored keys cannot be \
                         read with the new key. {RECOVERY}",
                        describe_schema(&a.key_schema),
                        describe_schema(&b.key_schema)
                    ),
                ));
            }
            if !same_types(&a.value_schema, &b.value_schema) {
                return Err(Error::user(
                    "STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE",
                    "XXKST",
                    format!(
                        "The state value of {op} was {} and is now {}: the stored values cannot \
                         be read as the new ones. {RECOVERY}",
                        describe_schema(&a.value_schema),
                        describe_schema(&b.value_schema)
                    ),
                ));
            }
            if a.fingerprint != b.fingerprint && !allow_fingerprint_change {
                return Err(Error::user(
                    "STATEFUL_OPERATOR_DEFINITION_CHANGED",
                    "42K03",
                    format!(
                        "The definition of {op} changed: it was [{}] and is now [{}]. Its state has \
                         the same shape, so it could be read, but it was computed for the old \
                         definition and would give wrong results for the new one (Spark accepts \
                         this silently). {RECOVERY} If the old state really fits the new \
                         definition, restart once with the writer option \
                         allowStateDefinitionChange = true.",
                        a.fingerprint.join("; "),
                        b.fingerprint.join("; ")
                    ),
                ));
            }
            if a.num_partitions != b.num_partitions {
                return Err(Error::Internal(format!(
                    "{op} was planned with {} partitions but its state has {}",
                    b.num_partitions, a.num_partitions
                )));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn op(name: &str, key: DataType, value: DataType, fingerprint: &str) -> OperatorInfo {
        OperatorInfo {
            operator_id: 0,
            operator_name: name.into(),
            num_partitions: 2,
            store_names: vec!["default".into()],
            key_schema: Schema::new(vec![Field::new("k", key, true)]),
            value_schema: Schema::new(vec![Field::new("v", value, true)]),
            fingerprint: vec![fingerprint.into()],
            layout: None,
        }
    }

    #[test]
    fn metadata_round_trips_and_damage_is_named() {
        let m = StateMetadata {
            operators: vec![op(
                "aggregate",
                DataType::Int64,
                DataType::Int64,
                "count(1)",
            )],
        };
        assert_eq!(StateMetadata::decode(m.encode().as_bytes()).unwrap(), m);
        let text = m.encode();
        let cut = &text.as_bytes()[..text.len() - 5];
        assert!(StateMetadata::decode(cut).unwrap_err().contains("damaged"));
        assert!(
            StateMetadata::decode(b"v9\n{}")
                .unwrap_err()
                .contains("newer")
        );
    }

    fn class(r: Result<()>) -> String {
        match r {
            Err(Error::User(e)) => e.class.to_string(),
            other => format!("{other:?}"),
        }
    }

    #[test]
    fn restart_checks_name_shape_and_meaning() {
        let base = StateMetadata {
            operators: vec![op(
                "aggregate",
                DataType::Int64,
                DataType::Int64,
                "count(1)",
            )],
        };
        let same = op("aggregate", DataType::Int64, DataType::Int64, "count(1)");
        assert!(base.check(std::slice::from_ref(&same), false).is_ok());
        assert_eq!(
            class(base.check(&[], false)),
            "STREAMING_STATEFUL_OPERATOR_NOT_MATCH_IN_STATE_METADATA"
        );
        assert_eq!(
            class(base.check(
                &[op("dedupe", DataType::Int64, DataType::Int64, "count(1)")],
                false
            )),
            "STREAMING_STATEFUL_OPERATOR_NOT_MATCH_IN_STATE_METADATA"
        );
        assert_eq!(
            class(base.check(
                &[op("aggregate", DataType::Utf8, DataType::Int64, "count(1)")],
                false
            )),
            "STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE"
        );
        assert_eq!(
            class(base.check(
                &[op(
                    "aggregate",
                    DataType::Int64,
                    DataType::Float64,
                    "count(1)"
                )],
                false
            )),
            "STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE"
        );
        let meaning = op("aggregate", DataType::Int64, DataType::Int64, "sum(value)");
        assert_eq!(
            class(base.check(std::slice::from_ref(&meaning), false)),
            "STATEFUL_OPERATOR_DEFINITION_CHANGED"
        );
        assert!(base.check(&[meaning], true).is_ok());
        // State an older weir laid out in other stores is refused even when it is allowed to
        // change meaning: it cannot be read at all.
        let mut relaid = same.clone();
        relaid.store_names = vec!["default-v2".into()];
        assert_eq!(
            class(base.check(&[relaid], true)),
            "STATE_STORE_LAYOUT_NOT_COMPATIBLE"
        );
        // Names and nullability do not matter; nested types do.
        let mut renamed = same.clone();
        renamed.key_schema = Schema::new(vec![Field::new("other", DataType::Int64, false)]);
        assert!(base.check(&[renamed], false).is_ok());
        let s = |t: DataType| DataType::Struct(vec![Arc::new(Field::new("a", t, true))].into());
        let nested = StateMetadata {
            operators: vec![op("aggregate", s(DataType::Int64), DataType::Int64, "x")],
        };
        assert!(
            nested
                .check(
                    &[op("aggregate", s(DataType::Int64), DataType::Int64, "x")],
                    false
                )
                .is_ok()
        );
        assert_eq!(
            class(nested.check(
                &[op("aggregate", s(DataType::Int32), DataType::Int64, "x")],
                false
            )),
            "STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE"
        );
    }
}
