//! The kinds of stateful operator, and how each lays out its state for the tools that read it
//! offline: `read_state` decodes it ([`StateFormat::read_entries`], [`StateFormat::decode_values`])
//! and `checkpoint repartition` re-splits it ([`StateFormat::placement`]).
//!
//! ```text
//! OperatorInfo.operator_name ──OperatorKind::of──▶ OperatorKind ──format()──▶ &dyn StateFormat
//!                                                                  (implemented next to each
//!                                                                   operator, in its module)
//! ```
//!
//! The names are what the checkpoint records (`state/_metadata`) and progress records report,
//! as Spark names its operators; they never change.

use arrow::array::ArrayRef;
use arrow::datatypes::{Fields, Schema};
use arrow::row::{RowConverter, SortField};
use datafusion::error::Result;

use super::OperatorInfo;

/// A kind of stateful operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OperatorKind {
    /// A streaming aggregation (`GROUP BY`, windows).
    Aggregate,
    /// `dropDuplicates` / `SELECT DISTINCT` over a stream.
    Dedupe,
    /// `dropDuplicatesWithinWatermark`.
    DedupeWithinWatermark,
    /// An aggregation over `session_window`.
    SessionWindowAggregate,
    /// A join of two streams.
    StreamStreamJoin,
    /// AUTO CDC into an SCD type 1 table.
    AutoCdcScd1,
    /// AUTO CDC into an SCD type 2 table.
    AutoCdcScd2,
    /// Top-N per key (`row_number() OVER (PARTITION BY ... ORDER BY ...) <= N`).
    TopN,
}

impl OperatorKind {
    /// Every kind.
    pub(crate) const ALL: [Self; 8] = [
        Self::Aggregate,
        Self::Dedupe,
        Self::DedupeWithinWatermark,
        Self::SessionWindowAggregate,
        Self::StreamStreamJoin,
        Self::AutoCdcScd1,
        Self::AutoCdcScd2,
        Self::TopN,
    ];

    /// The name the checkpoint and progress records use.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Aggregate => "aggregate",
            Self::Dedupe => "dedupe",
            Self::DedupeWithinWatermark => "dedupeWithinWatermark",
            Self::SessionWindowAggregate => "sessionWindowAggregate",
            Self::StreamStreamJoin => "streamStreamJoin",
            Self::AutoCdcScd1 => "autoCdcScd1",
            Self::AutoCdcScd2 => "autoCdcScd2",
            Self::TopN => "topN",
        }
    }

    /// The kind named `name`; `None` for a name this weir does not know (a checkpoint of
    /// another engine or a later weir).
    pub(crate) fn of(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.name() == name)
    }

    /// How the kind's state is laid out.
    pub(crate) fn format(self) -> &'static dyn StateFormat {
        match self {
            Self::Aggregate => &super::aggregate::AggregateFormat,
            Self::Dedupe | Self::DedupeWithinWatermark => &super::dedupe::DedupeFormat,
            Self::SessionWindowAggregate => &super::session::SessionFormat,
            Self::StreamStreamJoin => &super::join::JoinFormat,
            Self::AutoCdcScd1 => &super::auto_cdc::AutoCdcFormat { scd_type: 1 },
            Self::AutoCdcScd2 => &super::auto_cdc::AutoCdcFormat { scd_type: 2 },
            Self::TopN => &super::top_n::TopNFormat,
        }
    }
}

impl OperatorInfo {
    /// The operator's kind, if this weir knows it.
    pub(crate) fn kind(&self) -> Option<OperatorKind> {
        OperatorKind::of(&self.operator_name)
    }

    /// What the keys of the operator's store `store` are made of.
    pub(crate) fn key_shape(&self, store: &str) -> weir_state::KeyShape {
        self.kind().map_or(weir_state::KeyShape::Opaque, |k| {
            k.format().key_shape(store)
        })
    }
}

/// Where repartitioning sends a store's entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Placement {
    /// Each entry's key is a state key (the operator's key schema): it goes where the key's
    /// shuffle key goes.
    ByKey,
    /// Each entry's key is an event time (an arrow-row Int64) then a state key.
    ByKeyAfterTime,
    /// Each entry lists rows of many join keys: the join's event-time index, whose entries are
    /// split ([`super::join_state::split_index`]).
    JoinIndex,
    /// A join side's rows and row counts: each entry goes where its join key
    /// ([`super::join_state::join_key`]) goes.
    JoinRows,
    /// Every partition keeps the same entries (AUTO CDC's truncate floor): each key goes to every
    /// partition with the highest value any partition had.
    EveryPartition,
}

/// How an operator kind lays out its state in its stores.
pub(crate) trait StateFormat: Sync {
    /// Whether `read_state` decodes store `store` (indexes it does not).
    fn readable(&self, store: &str) -> bool;

    /// The value columns `read_state` shows for store `store`.
    fn read_fields(&self, op: &OperatorInfo, _store: &str) -> Fields {
        op.value_schema.fields().clone()
    }

    /// One stored entry as `read_state` rows, each a key and a value; `None` when the value is
    /// damaged.
    fn read_entries(&self, key: &[u8], value: &[u8]) -> Option<Vec<(Vec<u8>, Vec<u8>)>> {
        Some(vec![(key.to_vec(), value.to_vec())])
    }

    /// The value columns (typed `fields`) of `values`, as [`StateFormat::read_entries`] gave
    /// them.
    fn decode_values(&self, fields: &Fields, values: &[&[u8]]) -> Result<Vec<ArrayRef>> {
        decode_rows(fields, values)
    }

    /// Where repartitioning sends the entries of store `store`.
    fn placement(&self, _store: &str) -> Placement {
        Placement::ByKey
    }

    /// What the keys of store `store` are made of, for the backend to index.
    fn key_shape(&self, _store: &str) -> weir_state::KeyShape {
        weir_state::KeyShape::Opaque
    }
}

/// `values`, each an arrow-row of `fields`, as columns.
pub(crate) fn decode_rows(fields: &Fields, values: &[&[u8]]) -> Result<Vec<ArrayRef>> {
    if fields.is_empty() {
        return Ok(vec![]);
    }
    let converter = RowConverter::new(sort_fields(&Schema::new(fields.clone())))?;
    let parser = converter.parser();
    Ok(converter.convert_rows(values.iter().map(|v| parser.parse(v)))?)
}

/// The arrow-row fields of `schema`'s columns.
pub(crate) fn sort_fields(schema: &Schema) -> Vec<SortField> {
    schema
        .fields()
        .iter()
        .map(|f| SortField::new(f.data_type().clone()))
        .collect()
}

/// Columns for a struct of `fields` and `n` rows from [`StateFormat::decode_values`].
pub(crate) fn value_struct(
    fields: &Fields,
    columns: Vec<ArrayRef>,
    n: usize,
) -> Result<arrow::array::StructArray> {
    if fields.is_empty() {
        return Ok(arrow::array::StructArray::new_empty_fields(n, None));
    }
    Ok(arrow::array::StructArray::try_new(
        fields.clone(),
        columns,
        None,
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_is_found_by_its_recorded_name() {
        for kind in OperatorKind::ALL {
            assert_eq!(OperatorKind::of(kind.name()), Some(kind));
        }
        assert_eq!(OperatorKind::of("flatMapGroupsWithState"), None);
        assert_eq!(OperatorKind::of("Aggregate"), None);
    }

    #[test]
    fn only_state_stores_are_readable_and_indexes_are_placed_by_their_layout() {
        let f = OperatorKind::Aggregate.format();
        assert!(f.readable("default"));
        assert_eq!(f.placement("default"), Placement::ByKey);
        let f = OperatorKind::DedupeWithinWatermark.format();
        assert!(f.readable("default") && !f.readable("default-by-expiry"));
        assert_eq!(f.placement("default-by-expiry"), Placement::ByKeyAfterTime);
        let f = OperatorKind::SessionWindowAggregate.format();
        assert!(f.readable("sessions") && !f.readable("sessions-by-end"));
        assert_eq!(f.placement("sessions-by-end"), Placement::ByKeyAfterTime);
        let f = OperatorKind::AutoCdcScd1.format();
        assert!(f.readable("default") && !f.readable("truncated"));
        assert_eq!(f.placement("truncated"), Placement::EveryPartition);
        assert_eq!(f.placement("tombstones-by-time"), Placement::ByKeyAfterTime);
        let f = OperatorKind::StreamStreamJoin.format();
        assert!(f.readable("left-rows") && f.readable("right-rows") && !f.readable("left-times"));
        assert_eq!(f.placement("right-times"), Placement::JoinIndex);
        assert_eq!(f.placement("right-rows"), Placement::JoinRows);
    }

    #[test]
    fn rows_decode_to_columns_and_no_fields_to_no_columns() {
        use std::sync::Arc;

        use arrow::array::{Array, Int64Array};
        use arrow::datatypes::{DataType, Field};
        let fields = Fields::from(vec![Field::new("n", DataType::Int64, true)]);
        let converter = RowConverter::new(vec![SortField::new(DataType::Int64)]).unwrap();
        let rows = converter
            .convert_columns(&[Arc::new(Int64Array::from(vec![Some(3), None])) as ArrayRef])
            .unwrap();
        let bytes: Vec<&[u8]> = rows.iter().map(|r| r.data()).collect();
        let columns = decode_rows(&fields, &bytes).unwrap();
        let n = columns[0].as_any().downcast_ref::<Int64Array>().unwrap();
        assert_eq!(n.value(0), 3);
        assert!(n.is_null(1));
        assert!(decode_rows(&Fields::empty(), &bytes).unwrap().is_empty());
        assert_eq!(value_struct(&Fields::empty(), vec![], 2).unwrap().len(), 2);
    }
}
