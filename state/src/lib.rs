//! weir-state: the state store of weir's stateful operators (DESIGN.md §4).
//!
//! An operator keeps its state in one [`StateStore`] per `(operator, shuffle partition, store
//! name)` ([`StoreId`]). A store is opened at a version — the state as the batch before it left
//! it — read with batched [`StateStore::multi_get`] and ordered [`StateStore::scan`], changed with
//! one [`WriteBatch`] per micro-batch, and made durable as the next version by
//! [`StateStore::commit`]. Keys and values are opaque bytes: operators encode keys with arrow-row
//! so that byte order is key order (and event time first, so watermark eviction is a range scan).
//!
//! Backends implement [`StateStoreProvider`]: [`MemoryStateStoreProvider`] for operator unit
//! tests; the RocksDB provider is the default for queries (no `rocksdb` type appears in this
//! crate's public API).

mod codec;
mod error;
mod memory;
mod rocksdb;
mod store;
pub mod table;

pub use codec::key_partition;
pub use error::{Error, Result};
pub use memory::MemoryStateStoreProvider;
pub use rocksdb::{RocksDbConfig, RocksDbStateStoreProvider, SstCompression};
pub use store::{
    KeyRange, KeyShape, PrefixVisitor, StateStore, StateStoreProvider, StoreId, StoreMetrics,
    WriteBatch,
};

#[cfg(test)]
pub(crate) mod conformance;
