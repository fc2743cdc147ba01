//! The backend-neutral state store trait and its vocabulary.

use std::fmt;
use std::ops::Bound;

use crate::Result;

/// One state store instance: an operator's store `name` for one shuffle partition.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StoreId {
    /// The stateful operator's ID (its position in plan-traversal order).
    pub operator: u32,
    /// The shuffle partition.
    pub partition: u32,
    /// The store's name within the operator (e.g. `default`, `left-keyToNumValues`).
    pub name: String,
}

impl StoreId {
    /// A store ID.
    pub fn new(operator: u32, partition: u32, name: impl Into<String>) -> Self {
        Self {
            operator,
            partition,
            name: name.into(),
        }
    }
}

impl fmt::Display for StoreId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}/{}", self.operator, self.partition, self.name)
    }
}

/// The changes of one micro-batch to one store, applied together. Keys and values lie end to
/// end in one buffer: a batch of a join's hundreds of thousands of writes is a few
/// allocations, not two per write (which, with the copies a store made of them, were much of a
/// join's peak memory and allocator time, issue 21).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct WriteBatch {
    bytes: Vec<u8>,
    ops: Vec<Op>,
    key_delta: Option<i64>,
}

/// Where one operation's key and value lie in [`WriteBatch::bytes`]: the key at
/// `start..key_end`, the value at `key_end..value_end`; a delete's `value_end` is [`DELETE`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Op {
    start: usize,
    key_end: usize,
    value_end: usize,
}

/// An [`Op`]'s `value_end` when it deletes: no buffer is that long.
const DELETE: usize = usize::MAX;

impl WriteBatch {
    /// An empty batch.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty batch with room for `ops` operations of `bytes` key and value bytes in all.
    pub fn with_capacity(ops: usize, bytes: usize) -> Self {
        Self {
            bytes: Vec::with_capacity(bytes),
            ops: Vec::with_capacity(ops),
            key_delta: None,
        }
    }

    /// A batch of `ops` (key, value; `None` deletes), in their order.
    pub fn of<'a>(ops: impl Iterator<Item = (&'a [u8], Option<&'a [u8]>)> + Clone) -> Self {
        let bytes = ops
            .clone()
            .map(|(k, v)| k.len() + v.map_or(0, <[u8]>::len))
            .sum();
        let mut batch = Self::with_capacity(ops.size_hint().0, bytes);
        for (k, v) in ops {
            match v {
                Some(v) => batch.put(k, v),
                None => batch.delete(k),
            }
        }
        batch
    }

    /// Sets `key` to `value`.
    pub fn put(&mut self, key: impl AsRef<[u8]>, value: impl AsRef<[u8]>) {
        self.put_parts(&[key.as_ref()], &[value.as_ref()]);
    }

    /// Sets the key made of `key`'s parts end to end to the value made of `value`'s: a key or
    /// value built from pieces is written without first being put together elsewhere.
    pub fn put_parts(&mut self, key: &[&[u8]], value: &[&[u8]]) {
        let start = self.bytes.len();
        key.iter().for_each(|p| self.bytes.extend_from_slice(p));
        let key_end = self.bytes.len();
        value.iter().for_each(|p| self.bytes.extend_from_slice(p));
        self.ops.push(Op {
            start,
            key_end,
            value_end: self.bytes.len(),
        });
    }

    /// Removes `key`.
    pub fn delete(&mut self, key: impl AsRef<[u8]>) {
        self.delete_parts(&[key.as_ref()]);
    }

    /// Removes the key made of `key`'s parts end to end.
    pub fn delete_parts(&mut self, key: &[&[u8]]) {
        let start = self.bytes.len();
        key.iter().for_each(|p| self.bytes.extend_from_slice(p));
        self.ops.push(Op {
            start,
            key_end: self.bytes.len(),
            value_end: DELETE,
        });
    }

    /// The operation at `i` (`None` past the end): its key, and its value (`None` deletes).
    pub fn get(&self, i: usize) -> Option<(&[u8], Option<&[u8]>)> {
        self.ops.get(i).map(|op| self.op(op))
    }

    /// The operation at `i`, which is below [`WriteBatch::len`].
    pub(crate) fn at(&self, i: usize) -> (&[u8], Option<&[u8]>) {
        self.op(&self.ops[i])
    }

    fn op(&self, op: &Op) -> (&[u8], Option<&[u8]>) {
        let key = &self.bytes[op.start..op.key_end];
        let value = (op.value_end != DELETE).then(|| &self.bytes[op.key_end..op.value_end]);
        (key, value)
    }

    /// The operations in order (key, value; `None` deletes); a later one on the same key wins.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (&[u8], Option<&[u8]>)> + Clone + '_ {
        self.ops.iter().map(|op| self.op(op))
    }

    /// How many operations the batch holds.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// The bytes of all keys and values together.
    pub fn payload_bytes(&self) -> usize {
        self.bytes.len()
    }

    /// States how many keys the batch adds to the store (negative: removes), counted against
    /// the store as the batches applied before it left it. A backend that counts keys can then
    /// skip looking them up; a wrong figure only makes `num_keys` wrong.
    pub fn with_key_delta(mut self, delta: i64) -> Self {
        self.key_delta = Some(delta);
        self
    }

    /// The stated key delta, if any.
    pub fn key_delta(&self) -> Option<i64> {
        self.key_delta
    }

    /// Whether the batch changes nothing.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }
}

impl fmt::Debug for WriteBatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WriteBatch")
            .field("ops", &self.iter().collect::<Vec<_>>())
            .field("key_delta", &self.key_delta)
            .finish()
    }
}

/// A range of keys in byte order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyRange {
    /// Lower bound.
    pub start: Bound<Vec<u8>>,
    /// Upper bound.
    pub end: Bound<Vec<u8>>,
}

impl KeyRange {
    /// Every key.
    pub fn all() -> Self {
        Self {
            start: Bound::Unbounded,
            end: Bound::Unbounded,
        }
    }

    /// Keys that begin with `prefix`.
    pub fn prefix(prefix: &[u8]) -> Self {
        // The first key past them: the prefix with its last byte below 0xFF raised by one and
        // what follows it dropped (none when every byte is 0xFF).
        let end = prefix.iter().rposition(|&b| b < 0xFF).map(|at| {
            let mut end = prefix[..=at].to_vec();
            end[at] += 1;
            end
        });
        Self {
            start: Bound::Included(prefix.to_vec()),
            end: end.map_or(Bound::Unbounded, Bound::Excluded),
        }
    }

    /// Keys below `end` (exclusive): what a watermark evicts when event time leads the key.
    pub fn below(end: impl Into<Vec<u8>>) -> Self {
        Self {
            start: Bound::Unbounded,
            end: Bound::Excluded(end.into()),
        }
    }

    /// Whether `key` lies in the range.
    pub fn contains(&self, key: &[u8]) -> bool {
        !self.before_start(key) && !self.past_end(key)
    }

    /// Whether `key` sorts before the range.
    pub fn before_start(&self, key: &[u8]) -> bool {
        match &self.start {
            Bound::Unbounded => false,
            Bound::Included(s) => key < s.as_slice(),
            Bound::Excluded(s) => key <= s.as_slice(),
        }
    }

    /// Whether `key` sorts after the range.
    pub fn past_end(&self, key: &[u8]) -> bool {
        match &self.end {
            Bound::Unbounded => false,
            Bound::Included(e) => key > e.as_slice(),
            Bound::Excluded(e) => key >= e.as_slice(),
        }
    }
}

/// What a store's keys are made of, as far as a backend may use it to read them faster. A
/// backend that ignores it still reads and writes every store correctly.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum KeyShape {
    /// Opaque keys.
    #[default]
    Opaque,
    /// Every key is a prefix followed by `suffix` bytes (a join side's rows: the join key,
    /// then the batch and row that stored the row), no prefix begins another (arrow-row keys
    /// say where each column ends), and reads ask for whole prefixes
    /// ([`StateStore::scan_prefixes`]). RocksDB keeps a bloom filter of the prefixes, so that
    /// asking for a prefix no key has reads nothing: most of a join's lookups.
    Prefixed {
        /// The bytes after the prefix.
        suffix: usize,
    },
}

/// Figures a store reports for the progress record's `stateOperators`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StoreMetrics {
    /// Keys in the store at its current version.
    pub num_keys: u64,
    /// Bytes of memory the store uses.
    pub memory_used_bytes: u64,
    /// Backend figures under Spark's names where they mean the same (e.g.
    /// `rocksdbSstFileSize`, `rocksdbBytesCopied`).
    pub custom: std::collections::BTreeMap<String, i64>,
}

/// What [`StateStore::scan_prefixes`] calls with each entry: the index of the prefix asked for
/// that the key begins with, the key, the value.
pub type PrefixVisitor<'a> = dyn FnMut(usize, &[u8], &[u8]) + 'a;

/// A key-value store with versions, read and written a micro-batch at a time.
pub trait StateStore: Send {
    /// The store's identity.
    fn id(&self) -> &StoreId;

    /// The version the store was opened at; reads see it plus the writes applied since.
    fn version(&self) -> u64;

    /// The values of `keys`, in order (`None` where absent), including writes applied since
    /// opening.
    fn multi_get(&self, keys: &[&[u8]]) -> Result<Vec<Option<Vec<u8>>>>;

    /// Every key-value pair in `range`, in key order, including writes applied since opening.
    fn scan(&self, range: &KeyRange) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let mut out = vec![];
        self.scan_each(range, &mut |k, v| out.push((k.to_vec(), v.to_vec())))?;
        Ok(out)
    }

    /// Calls `visit` with every key-value pair in `range`, in key order, including writes
    /// applied since opening, without collecting them: a caller that keeps a few entries of
    /// many reads them without copying the rest.
    fn scan_each(&self, range: &KeyRange, visit: &mut dyn FnMut(&[u8], &[u8])) -> Result<()>;

    /// Calls `visit(i, key, value)` with every key-value pair whose key begins with
    /// `prefixes[i]`, including writes applied since opening: each prefix's pairs in key order,
    /// the prefixes in byte order. In a store opened [`KeyShape::Prefixed`], the prefixes are
    /// whole prefixes of that shape. A store reads many prefixes in one pass rather than one
    /// scan each (RocksDB: one iterator, and a bloom filter for absent prefixes).
    fn scan_prefixes(&self, prefixes: &[&[u8]], visit: &mut PrefixVisitor<'_>) -> Result<()> {
        let mut order: Vec<usize> = (0..prefixes.len()).collect();
        order.sort_by(|&a, &b| prefixes[a].cmp(prefixes[b]));
        for i in order {
            self.scan_each(&KeyRange::prefix(prefixes[i]), &mut |k, v| visit(i, k, v))?;
        }
        Ok(())
    }

    /// Stages a micro-batch's changes; they become durable only with [`StateStore::commit`].
    fn apply(&mut self, batch: WriteBatch) -> Result<()>;

    /// Makes the state durable as version `version() + 1` and returns that version.
    fn commit(&mut self) -> Result<u64>;

    /// The store's figures at this point.
    fn metrics(&self) -> StoreMetrics;
}

/// A state backend: opens store instances at a version and forgets old versions.
pub trait StateStoreProvider: Send + Sync + fmt::Debug {
    /// The backend's name as users configure it (`memory`, `rocksdb`).
    fn name(&self) -> &'static str;

    /// Whether the backend can make versions durable in the background (async checkpointing).
    fn supports_async_checkpoint(&self) -> bool;

    /// Opens `id` at `version`; version 0 is the empty state before the first batch.
    fn open(&self, id: &StoreId, version: u64) -> Result<Box<dyn StateStore>>;

    /// Opens `id` at `version` as [`StateStoreProvider::open`] does (which opens an opaque
    /// store), for a store whose keys have `shape`. A backend lays a store out as the open that
    /// first brings it into memory says; a store opened with another shape than that reads as
    /// an opaque one, so reads are correct whatever was decided.
    fn open_shaped(
        &self,
        id: &StoreId,
        version: u64,
        shape: KeyShape,
    ) -> Result<Box<dyn StateStore>> {
        let _ = shape;
        self.open(id, version)
    }

    /// Forgets the versions of `id` below `version` (with the batch retention).
    fn purge_below(&self, id: &StoreId, version: u64) -> Result<()>;

    /// The lowest and highest version of `id` this provider holds in memory, for a backend
    /// whose versions live nowhere else (`None`: the checkpoint's files tell).
    fn versions_held(&self, _id: &StoreId) -> Option<(u64, u64)> {
        None
    }

    /// Waits until every version up to `version` that was committed is durable in the
    /// checkpoint, and reports a background upload's failure. Synchronous backends are durable
    /// at commit.
    fn wait_durable(&self, _version: u64) -> Result<()> {
        Ok(())
    }

    /// Ends the run that opened the provider: finishes background work and leaves what is
    /// local in a state the next run can pick up (RocksDB: its instances flushed and closed).
    /// The provider is not used afterwards.
    fn close(&self) -> Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefix_range_holds_the_keys_that_begin_with_the_prefix() {
        let r = KeyRange::prefix(b"ab");
        assert!(r.contains(b"ab") && r.contains(b"ab\xFF\xFF") && r.contains(b"abc"));
        assert!(!r.contains(b"aa\xFF") && !r.contains(b"ac") && !r.contains(b"a"));
        // Trailing 0xFF bytes cannot be raised: the byte before them is.
        let r = KeyRange::prefix(b"a\xFF");
        assert_eq!(r.end, Bound::Excluded(b"b".to_vec()));
        assert!(r.contains(b"a\xFF\xFF\x00") && !r.contains(b"b"));
        let r = KeyRange::prefix(b"\xFF\xFF");
        assert_eq!(r.end, Bound::Unbounded);
        assert!(r.contains(b"\xFF\xFF\x01") && !r.contains(b"\xFF\xFE"));
        assert!(KeyRange::prefix(b"").contains(b""));
    }
}
