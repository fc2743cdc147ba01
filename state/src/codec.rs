//! Byte encodings of state keys and values (DESIGN.md §4): keys with arrow-row, so the byte
//! order of encoded keys is the order of the key values and a state store's ordered scan is a
//! scan in key order (event time first where an operator puts it first, so watermark eviction
//! is a range scan); values with the same row format.

use arrow::array::ArrayRef;
use arrow::datatypes::SchemaRef;
use arrow::row::{RowConverter, SortField};

use crate::{Error, Result};

/// Encodes rows of a fixed set of columns to bytes and back.
#[derive(Debug)]
pub struct RowCodec {
    schema: SchemaRef,
    converter: RowConverter,
}

fn codec_error(e: impl std::fmt::Display) -> Error {
    Error::Backend {
        store: "codec".into(),
        message: e.to_string(),
    }
}

impl RowCodec {
    /// A codec for rows of `schema`'s columns, in that order.
    pub fn try_new(schema: SchemaRef) -> Result<Self> {
        let fields = schema
            .fields()
            .iter()
            .map(|f| SortField::new(f.data_type().clone()))
            .collect();
        let converter = RowConverter::new(fields).map_err(codec_error)?;
        Ok(Self { schema, converter })
    }

    /// The schema of the rows.
    pub fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    /// One byte string per row of `columns` (which must match the schema).
    pub fn encode(&self, columns: &[ArrayRef]) -> Result<Vec<Vec<u8>>> {
        let rows = self
            .converter
            .convert_columns(columns)
            .map_err(codec_error)?;
        Ok(rows.iter().map(|r| r.as_ref().to_vec()).collect())
    }

    /// The columns of encoded rows, the inverse of [`RowCodec::encode`]. The bytes must come
    /// from this codec's `encode`: state files are checksummed, so damaged bytes are refused
    /// before they get here.
    pub fn decode(&self, rows: &[&[u8]]) -> Result<Vec<ArrayRef>> {
        let parser = self.converter.parser();
        self.converter
            .convert_rows(rows.iter().map(|r| parser.parse(r)))
            .map_err(codec_error)
    }
}

/// The shuffle partition of an encoded state key, out of `partitions`.
///
/// Part of the checkpoint format: a key's state lives in this partition's store, so the
/// function must give the same answer in every build and on every machine (FNV-1a, 64 bits;
/// not Rust's or DataFusion's seeded hashers).
pub fn key_partition(key: &[u8], partitions: usize) -> usize {
    let h = key.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    });
    (h % partitions.max(1) as u64) as usize
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{Int64Array, StringArray, TimestampMicrosecondArray};
    use arrow::datatypes::{DataType, Field, Schema, TimeUnit};

    use super::*;

    #[test]
    fn key_partition_is_fixed() {
        // Fixed values: changing them would move state between partitions of old checkpoints.
        assert_eq!(
            key_partition(b"", 7),
            (0xcbf2_9ce4_8422_2325_u64 % 7) as usize
        );
        assert_eq!(key_partition(b"a", 1), 0);
        assert_eq!(
            key_partition(b"a", 1000),
            (0xaf63_dc4c_8601_ec8c_u64 % 1000) as usize
        );
    }

    #[test]
    fn encoded_keys_sort_like_their_values_and_decode_back() {
        let schema = Arc::new(Schema::new(vec![
            Field::new(
                "window_end",
                DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
                true,
            ),
            Field::new("k", DataType::Int64, true),
            Field::new("s", DataType::Utf8, true),
        ]));
        let codec = RowCodec::try_new(Arc::clone(&schema)).unwrap();
        let columns: Vec<ArrayRef> = vec![
            Arc::new(
                TimestampMicrosecondArray::from(vec![Some(20), Some(10), Some(10), None, Some(-5)])
                    .with_timezone("UTC"),
            ),
            Arc::new(Int64Array::from(vec![
                Some(1),
                Some(-3),
                Some(2),
                Some(0),
                None,
            ])),
            Arc::new(StringArray::from(vec![
                Some("b"),
                Some("a"),
                None,
                Some(""),
                Some("z"),
            ])),
        ];
        let rows = codec.encode(&columns).unwrap();
        let mut order: Vec<usize> = (0..rows.len()).collect();
        order.sort_by(|&a, &b| rows[a].cmp(&rows[b]));
        // Nulls first, then by time, then by key: (null,0,""), (-5,null,z), (10,-3,a), (10,2,null), (20,1,b).
        assert_eq!(order, vec![3, 4, 1, 2, 0]);
        let refs: Vec<&[u8]> = rows.iter().map(Vec::as_slice).collect();
        let back = codec.decode(&refs).unwrap();
        for (a, b) in back.iter().zip(&columns) {
            assert_eq!(a.as_ref(), b.as_ref());
        }
    }
}
