//! The in-memory state store provider: every version held in memory, for operator unit tests
//! and short-lived queries. Not durable across processes; no async checkpointing.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use crate::store::{KeyRange, StateStore, StateStoreProvider, StoreId, StoreMetrics, WriteBatch};
use crate::{Error, Result};

type Map = BTreeMap<Vec<u8>, Vec<u8>>;
type Versions = HashMap<StoreId, BTreeMap<u64, Arc<Map>>>;

/// Keeps the committed versions of every store in memory (each version a full copy of the
/// store). Clones share the same stores, so a test can "restart" an operator by opening again
/// from a clone.
#[derive(Debug, Clone, Default)]
pub struct MemoryStateStoreProvider {
    versions: Arc<Mutex<Versions>>,
    /// Keep only this many newest versions per store (`None`: until purged).
    retained: Option<usize>,
}

impl MemoryStateStoreProvider {
    /// An empty provider keeping every version until purged.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty provider keeping only the `n` newest versions of each store (at least 1), as
    /// Spark's `maxBatchesToRetainInMemory`: a running query only ever opens the newest one,
    /// and each version is a full copy.
    pub fn with_retained_versions(n: usize) -> Self {
        Self {
            retained: Some(n.max(1)),
            ..Self::default()
        }
    }

    fn lock(&self, id: &StoreId) -> Result<std::sync::MutexGuard<'_, Versions>> {
        lock(&self.versions, id)
    }
}

impl StateStoreProvider for MemoryStateStoreProvider {
    fn name(&self) -> &'static str {
        "memory"
    }

    fn supports_async_checkpoint(&self) -> bool {
        false
    }

    fn open(&self, id: &StoreId, version: u64) -> Result<Box<dyn StateStore>> {
        let versions = self.lock(id)?;
        let state = match versions.get(id).and_then(|v| v.get(&version)) {
            Some(state) => Arc::clone(state),
            None if version == 0 => Arc::new(Map::new()),
            None => {
                let available = versions
                    .get(id)
                    .map(|v| v.keys().map(u64::to_string).collect::<Vec<_>>().join(", "))
                    .filter(|s| !s.is_empty())
                    .unwrap_or_else(|| "none".into());
                return Err(Error::VersionNotFound {
                    store: id.to_string(),
                    version,
                    available,
                });
            }
        };
        Ok(Box::new(MemoryStateStore {
            id: id.clone(),
            version,
            state,
            versions: Arc::clone(&self.versions),
            retained: self.retained,
        }))
    }

    fn purge_below(&self, id: &StoreId, version: u64) -> Result<()> {
        if let Some(v) = self.lock(id)?.get_mut(id) {
            v.retain(|&k, _| k >= version);
        }
        Ok(())
    }

    fn versions_held(&self, id: &StoreId) -> Option<(u64, u64)> {
        let versions = self.lock(id).ok()?;
        let mine = versions.get(id)?;
        Some((*mine.keys().next()?, *mine.keys().next_back()?))
    }
}

fn lock<'a>(
    versions: &'a Mutex<Versions>,
    id: &StoreId,
) -> Result<std::sync::MutexGuard<'a, Versions>> {
    versions.lock().map_err(|_| Error::Backend {
        store: id.to_string(),
        message: "the in-memory store's lock was poisoned by a panic".into(),
    })
}

struct MemoryStateStore {
    id: StoreId,
    version: u64,
    /// The state as of `version`, plus applied writes (copied on the first write).
    state: Arc<Map>,
    versions: Arc<Mutex<Versions>>,
    retained: Option<usize>,
}

impl StateStore for MemoryStateStore {
    fn id(&self) -> &StoreId {
        &self.id
    }

    fn version(&self) -> u64 {
        self.version
    }

    fn multi_get(&self, keys: &[&[u8]]) -> Result<Vec<Option<Vec<u8>>>> {
        Ok(keys.iter().map(|k| self.state.get(*k).cloned()).collect())
    }

    fn scan_each(&self, range: &KeyRange, visit: &mut dyn FnMut(&[u8], &[u8])) -> Result<()> {
        for (k, v) in self
            .state
            .range::<Vec<u8>, _>((range.start.clone(), range.end.clone()))
        {
            visit(k, v);
        }
        Ok(())
    }

    fn apply(&mut self, batch: WriteBatch) -> Result<()> {
        if batch.is_empty() {
            return Ok(());
        }
        let state = Arc::make_mut(&mut self.state);
        for (k, v) in batch.iter() {
            match v {
                Some(v) => state.insert(k.to_vec(), v.to_vec()),
                None => state.remove(k),
            };
        }
        Ok(())
    }

    fn commit(&mut self) -> Result<u64> {
        let next = self.version + 1;
        let mut versions = lock(&self.versions, &self.id)?;
        let mine = versions.entry(self.id.clone()).or_default();
        mine.insert(next, Arc::clone(&self.state));
        if let Some(n) = self.retained {
            while mine.len() > n {
                mine.pop_first();
            }
        }
        self.version = next;
        Ok(next)
    }

    fn metrics(&self) -> StoreMetrics {
        StoreMetrics {
            num_keys: self.state.len() as u64,
            memory_used_bytes: self
                .state
                .iter()
                .map(|(k, v)| (k.len() + v.len()) as u64)
                .sum(),
            custom: Default::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_in_memory_provider_meets_the_state_store_contract() {
        crate::conformance::check(&MemoryStateStoreProvider::new(), true);
    }

    #[test]
    fn a_bounded_provider_keeps_only_the_newest_versions() {
        let p = MemoryStateStoreProvider::with_retained_versions(2);
        let id = StoreId::new(0, 0, "default");
        for v in 0..5u64 {
            let mut s = p.open(&id, v).unwrap();
            let mut b = WriteBatch::new();
            b.put(v.to_be_bytes(), vec![]);
            s.apply(b).unwrap();
            s.commit().unwrap();
        }
        assert_eq!(p.open(&id, 5).unwrap().metrics().num_keys, 5);
        assert!(p.open(&id, 4).is_ok());
        let err = p.open(&id, 3).err().unwrap();
        assert_eq!(err.error_class(), "STATE_STORE_VERSION_NOT_FOUND");
    }

    #[test]
    fn it_has_no_async_checkpointing() {
        assert!(!MemoryStateStoreProvider::new().supports_async_checkpoint());
    }
}
