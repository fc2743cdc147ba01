//! Byte encodings of state keys and values (DESIGN.md §4): operators encode keys with arrow-row
//! (`arrow::row`, straight into their batches' `Rows`, without a copy per row), so the byte
//! order of encoded keys is the order of the key values and a state store's ordered scan is a
//! scan in key order (event time first where an operator puts it first, so watermark eviction
//! is a range scan: see [`crate::table`]); values with the same row format. Which partition a
//! key lives in is [`key_partition`] of its encoding.

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

    use arrow::array::{ArrayRef, Int64Array, StringArray, TimestampMicrosecondArray};
    use arrow::datatypes::{DataType, TimeUnit};
    use arrow::row::{RowConverter, SortField};

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
        let converter = RowConverter::new(vec![
            SortField::new(DataType::Timestamp(
                TimeUnit::Microsecond,
                Some("UTC".into()),
            )),
            SortField::new(DataType::Int64),
            SortField::new(DataType::Utf8),
        ])
        .unwrap();
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
        let rows: Vec<Vec<u8>> = converter
            .convert_columns(&columns)
            .unwrap()
            .iter()
            .map(|r| r.as_ref().to_vec())
            .collect();
        let mut order: Vec<usize> = (0..rows.len()).collect();
        order.sort_by(|&a, &b| rows[a].cmp(&rows[b]));
        // Nulls first, then by time, then by key: (null,0,""), (-5,null,z), (10,-3,a), (10,2,null), (20,1,b).
        assert_eq!(order, vec![3, 4, 1, 2, 0]);
        let refs: Vec<&[u8]> = rows.iter().map(Vec::as_slice).collect();
        let parser = converter.parser();
        let back = converter
            .convert_rows(refs.iter().map(|r| parser.parse(r)))
            .unwrap();
        for (a, b) in back.iter().zip(&columns) {
            assert_eq!(a.as_ref(), b.as_ref());
        }
    }
}
