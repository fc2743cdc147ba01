//! Typed tables over state stores, in the shapes the stateful operators share.
//!
//! ```text
//! time key        [time: arrow-row Int64, 9 bytes][rest]: byte order is time order, so all
//!                 keys at or before a time are one range (watermark eviction is a range scan;
//!                 keys with a null time sort first and are never in one)
//! ValueChanges    one micro-batch's puts and deletes on a key → value store, with the change
//!                 in key count they make (what `WriteBatch::with_key_delta` wants)
//! TimeIndexedMap  key → value in one store, plus [time, key] → () in an index store: put a key
//!                 with its time; evict every key whose time a watermark passed with one range
//!                 scan of the index
//! ```
//!
//! Who uses what: the streaming aggregation and `dropDuplicates` put the event time first in
//! their keys (time keys in their one store); session windows index sessions by end, and the
//! stream-stream join its rows by event time and batch (time keys in an index store whose
//! values are their own); `dropDuplicatesWithinWatermark` keeps a [`TimeIndexedMap`] of each
//! key's expiry.

use std::ops::Bound;

use crate::{KeyRange, Result, StateStore, WriteBatch};

/// Bytes of a time key's time: arrow-row's encoding of a non-null Int64.
pub const TIME_PREFIX: usize = 9;

/// `time` as the leading bytes of a time key: arrow-row's encoding of a non-null Int64 (a
/// valid-marker byte, then the big-endian value with its sign bit flipped), so time keys sort
/// by time and a key arrow-row encoded with the time as its first column is a time key.
pub fn time_key(time: i64) -> Vec<u8> {
    let mut key = Vec::with_capacity(TIME_PREFIX + 16);
    key.push(1);
    let mut bytes = time.to_be_bytes();
    bytes[0] ^= 0x80;
    key.extend_from_slice(&bytes);
    key
}

/// `time`'s time key followed by `rest`.
pub fn time_key_with(time: i64, rest: &[u8]) -> Vec<u8> {
    let mut key = time_key(time);
    key.extend_from_slice(rest);
    key
}

/// What follows the time in a time key; `None` if the key is too short to be one.
pub fn after_time(key: &[u8]) -> Option<&[u8]> {
    key.get(TIME_PREFIX..)
}

/// The time keys whose time lies in `from..=up_to` (`from`: `None` from the earliest time;
/// the latest time, `i64::MAX`, is never in a range: a watermark saturates there).
pub fn times_up_to(from: Option<i64>, up_to: i64) -> KeyRange {
    KeyRange {
        start: Bound::Included(time_key(from.unwrap_or(i64::MIN))),
        end: Bound::Excluded(time_key(up_to.saturating_add(1))),
    }
}

/// One micro-batch's changes to a key → value store, counting the keys they add and remove.
#[derive(Debug, Default)]
pub struct ValueChanges {
    writes: WriteBatch,
    key_delta: i64,
}

impl ValueChanges {
    /// No changes.
    pub fn new() -> Self {
        Self::default()
    }

    /// No changes, with room for `ops` puts and removals of `bytes` key and value bytes in all.
    pub fn with_capacity(ops: usize, bytes: usize) -> Self {
        Self {
            writes: WriteBatch::with_capacity(ops, bytes),
            key_delta: 0,
        }
    }

    /// Puts `value` under `key`, which `existed` or not before.
    pub fn put(&mut self, key: impl AsRef<[u8]>, value: impl AsRef<[u8]>, existed: bool) {
        self.put_parts(&[key.as_ref()], &[value.as_ref()], existed);
    }

    /// Puts the value made of `value`'s parts under the key made of `key`'s, which `existed`
    /// or not before.
    pub fn put_parts(&mut self, key: &[&[u8]], value: &[&[u8]], existed: bool) {
        self.writes.put_parts(key, value);
        self.key_delta += i64::from(!existed);
    }

    /// Removes `key`, which was stored.
    pub fn remove(&mut self, key: impl AsRef<[u8]>) {
        self.remove_parts(&[key.as_ref()]);
    }

    /// Removes the key made of `key`'s parts, which was stored.
    pub fn remove_parts(&mut self, key: &[&[u8]]) {
        self.writes.delete_parts(key);
        self.key_delta -= 1;
    }

    /// Whether nothing changes.
    pub fn is_empty(&self) -> bool {
        self.writes.is_empty()
    }

    /// How many puts and removals there are.
    pub fn len(&self) -> usize {
        self.writes.len()
    }

    /// The keys put or removed, in the order they were.
    pub fn keys(&self) -> impl Iterator<Item = &[u8]> {
        self.writes.iter().map(|(k, _)| k)
    }

    /// Applies the changes to `store`.
    pub fn apply_to<S: StateStore + ?Sized>(self, store: &mut S) -> Result<()> {
        store.apply(self.writes.with_key_delta(self.key_delta))
    }
}

/// A key → value map kept with an index of each key's time, so that every key whose time has
/// passed is found by a range scan: `values` holds `key → value`, `index` holds
/// `[time, key] → ()` (an empty value).
pub struct TimeIndexedMap<'a, V: StateStore + ?Sized, I: StateStore + ?Sized> {
    values: &'a mut V,
    index: &'a mut I,
}

impl<'a, V: StateStore + ?Sized, I: StateStore + ?Sized> TimeIndexedMap<'a, V, I> {
    /// The map kept in `values` and `index`.
    pub fn new(values: &'a mut V, index: &'a mut I) -> Self {
        Self { values, index }
    }

    /// The values of `keys`, in order (`None` where absent).
    pub fn multi_get(&self, keys: &[&[u8]]) -> Result<Vec<Option<Vec<u8>>>> {
        self.values.multi_get(keys)
    }

    /// Adds `entries` (key, time, value), whose keys are not in the map.
    pub fn insert_new(&mut self, entries: Vec<(Vec<u8>, i64, Vec<u8>)>) -> Result<()> {
        let mut values = ValueChanges::new();
        let mut index = ValueChanges::new();
        for (key, time, value) in entries {
            index.put(time_key_with(time, &key), vec![], false);
            values.put(key, value, false);
        }
        values.apply_to(&mut *self.values)?;
        index.apply_to(&mut *self.index)
    }

    /// Removes every key whose time is in `from..=up_to` (`from`: where an earlier eviction
    /// stopped, or `None`) and returns them with their values, in time order.
    pub fn evict(&mut self, from: Option<i64>, up_to: i64) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let expired = self.index.scan(&times_up_to(from, up_to))?;
        if expired.is_empty() {
            return Ok(vec![]);
        }
        let keys: Vec<&[u8]> = expired.iter().filter_map(|(k, _)| after_time(k)).collect();
        let stored = self.values.multi_get(&keys)?;
        let mut out = Vec::with_capacity(keys.len());
        let mut values = ValueChanges::new();
        for (key, value) in keys.iter().zip(stored) {
            if let Some(value) = value {
                values.remove(key);
                out.push((key.to_vec(), value));
            }
        }
        let mut index = ValueChanges::new();
        for (k, _) in expired {
            index.remove(k);
        }
        values.apply_to(&mut *self.values)?;
        index.apply_to(&mut *self.index)?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{ArrayRef, Int64Array};
    use arrow::datatypes::DataType;
    use arrow::row::{RowConverter, SortField};

    use super::*;
    use crate::{MemoryStateStoreProvider, StateStoreProvider, StoreId};

    #[test]
    fn time_keys_are_arrow_rows_of_the_time_and_sort_by_it() {
        let times = [i64::MIN, -1_000_000, -1, 0, 1, 7_000_000, i64::MAX];
        let converter = RowConverter::new(vec![SortField::new(DataType::Int64)]).unwrap();
        let column: ArrayRef = Arc::new(Int64Array::from(times.to_vec()));
        let rows = converter.convert_columns(&[column]).unwrap();
        for (i, t) in times.iter().enumerate() {
            assert_eq!(time_key(*t), rows.row(i).as_ref(), "time {t}");
        }
        let keys: Vec<Vec<u8>> = times.iter().map(|t| time_key(*t)).collect();
        assert!(keys.windows(2).all(|w| w[0] < w[1]));
        // A null time (arrow-row's 0 marker) sorts before every time, outside every range.
        let null = converter
            .convert_columns(&[Arc::new(Int64Array::from(vec![None::<i64>])) as ArrayRef])
            .unwrap();
        assert!(!times_up_to(None, i64::MAX - 1).contains(null.row(0).as_ref()));
        assert_eq!(after_time(&time_key_with(5, b"k")), Some(&b"k"[..]));
        assert_eq!(after_time(&[1, 2]), None);
    }

    #[test]
    fn a_range_holds_the_times_from_its_start_up_to_its_end() {
        let r = times_up_to(Some(10), 20);
        assert!(r.contains(&time_key_with(10, b"a")));
        assert!(r.contains(&time_key_with(20, b"zzz")));
        assert!(!r.contains(&time_key_with(9, b"zzz")));
        assert!(!r.contains(&time_key_with(21, b"")));
        let all = times_up_to(None, i64::MAX - 1);
        assert!(
            all.contains(&time_key(i64::MIN)) && all.contains(&time_key_with(i64::MAX - 1, b"x"))
        );
    }

    #[test]
    fn a_time_indexed_map_evicts_by_range_and_counts_its_keys() {
        let provider = MemoryStateStoreProvider::new();
        let mut values = provider.open(&StoreId::new(0, 0, "default"), 0).unwrap();
        let mut index = provider.open(&StoreId::new(0, 0, "index"), 0).unwrap();
        let mut map = TimeIndexedMap::new(values.as_mut(), index.as_mut());
        map.insert_new(vec![
            (b"a".to_vec(), 30, b"A".to_vec()),
            (b"b".to_vec(), 10, b"B".to_vec()),
            (b"c".to_vec(), 20, b"C".to_vec()),
        ])
        .unwrap();
        assert_eq!(
            map.multi_get(&[b"a", b"x"]).unwrap(),
            [Some(b"A".to_vec()), None]
        );
        let gone = map.evict(None, 20).unwrap();
        assert_eq!(
            gone,
            [
                (b"b".to_vec(), b"B".to_vec()),
                (b"c".to_vec(), b"C".to_vec())
            ]
        );
        assert!(map.evict(Some(20), 29).unwrap().is_empty());
        assert_eq!(
            map.multi_get(&[b"b", b"a"]).unwrap(),
            [None, Some(b"A".to_vec())]
        );
        values.commit().unwrap();
        index.commit().unwrap();
        assert_eq!(values.metrics().num_keys, 1);
        assert_eq!(index.metrics().num_keys, 1);
    }
}
