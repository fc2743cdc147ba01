//! The handle of a running streaming query, and the query manager of a session.

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use uuid::Uuid;

use crate::execution::listener::{Event, ListenerBus, StreamingQueryListener};
use crate::{Error, StreamingQueryProgress};

/// How many progress records a query keeps (`spark.sql.streaming.numRecentProgressUpdates`).
pub const RECENT_PROGRESS: usize = 100;

/// What a query is doing now (Spark's `StreamingQueryStatus`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct QueryStatus {
    /// E.g. `Processing new data`, `Waiting for data to arrive`, `Stopped`.
    pub message: String,
    /// Whether the last trigger found new data.
    pub is_data_available: bool,
    /// Whether a trigger is running.
    pub is_trigger_active: bool,
}

/// A query that terminated with an error (`[STREAM_FAILED]`).
#[derive(Debug, Clone)]
pub struct StreamingQueryException {
    /// The query's ID.
    pub id: Uuid,
    /// The failed run's ID.
    pub run_id: Uuid,
    /// What failed.
    pub cause: Arc<Error>,
}

impl StreamingQueryException {
    /// Always `STREAM_FAILED`.
    pub fn error_class(&self) -> &'static str {
        "STREAM_FAILED"
    }

    /// The error class of the cause, e.g. `CONCURRENT_STREAM_LOG_UPDATE`.
    pub fn cause_error_class(&self) -> &'static str {
        self.cause.error_class()
    }
}

impl fmt::Display for StreamingQueryException {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "[STREAM_FAILED] Query [id = {}, runId = {}] terminated with exception: {} SQLSTATE: XXKST",
            self.id, self.run_id, self.cause
        )
    }
}

impl std::error::Error for StreamingQueryException {}

#[derive(Debug)]
pub(crate) struct QueryState {
    pub(crate) status: QueryStatus,
    pub(crate) recent: VecDeque<StreamingQueryProgress>,
    pub(crate) exception: Option<Arc<Error>>,
    pub(crate) active: bool,
    /// Triggers started so far in this run.
    pub(crate) triggers: u64,
    /// The last trigger that found no new data.
    pub(crate) last_idle_trigger: u64,
}

/// State shared between a query's handle and its execution.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) id: Uuid,
    pub(crate) run_id: Uuid,
    pub(crate) name: Option<String>,
    pub(crate) state: Mutex<QueryState>,
    pub(crate) changed: Notify,
    pub(crate) stop: tokio::sync::watch::Sender<bool>,
}

impl Shared {
    pub(crate) fn new(id: Uuid, name: Option<String>) -> Arc<Self> {
        Arc::new(Self {
            id,
            run_id: Uuid::new_v4(),
            name,
            state: Mutex::new(QueryState {
                status: QueryStatus {
                    message: "Initializing sources".into(),
                    is_data_available: false,
                    is_trigger_active: false,
                },
                recent: VecDeque::new(),
                exception: None,
                active: true,
                triggers: 0,
                last_idle_trigger: 0,
            }),
            changed: Notify::new(),
            stop: tokio::sync::watch::channel(false).0,
        })
    }

    pub(crate) fn update(&self, f: impl FnOnce(&mut QueryState)) {
        if let Ok(mut s) = self.state.lock() {
            f(&mut s);
        }
        self.changed.notify_waiters();
    }

    fn read<T>(&self, f: impl FnOnce(&QueryState) -> T) -> Option<T> {
        self.state.lock().ok().map(|s| f(&s))
    }

    /// Waits until `cond` holds, re-checking at every change.
    async fn wait_for(&self, cond: impl Fn(&QueryState) -> bool) {
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.read(&cond).unwrap_or(true) {
                return;
            }
            notified.await;
        }
    }
}

/// A running (or terminated) streaming query. Cloning gives another handle on the same query.
#[derive(Clone)]
pub struct StreamingQuery {
    pub(crate) shared: Arc<Shared>,
    pub(crate) task: Arc<Mutex<Option<tokio::task::JoinHandle<()>>>>,
}

impl fmt::Debug for StreamingQuery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StreamingQuery")
            .field("id", &self.shared.id)
            .field("run_id", &self.shared.run_id)
            .field("name", &self.shared.name)
            .finish()
    }
}

impl StreamingQuery {
    /// The query's ID, the same across restarts from the same checkpoint.
    pub fn id(&self) -> Uuid {
        self.shared.id
    }

    /// The ID of this run, new on every start.
    pub fn run_id(&self) -> Uuid {
        self.shared.run_id
    }

    /// The query name, if any.
    pub fn name(&self) -> Option<&str> {
        self.shared.name.as_deref()
    }

    /// What the query is doing now.
    pub fn status(&self) -> QueryStatus {
        self.shared
            .read(|s| s.status.clone())
            .unwrap_or_else(|| QueryStatus {
                message: "Unknown".into(),
                is_data_available: false,
                is_trigger_active: false,
            })
    }

    /// Whether the query is still running.
    pub fn is_active(&self) -> bool {
        self.shared.read(|s| s.active).unwrap_or(false)
    }

    /// The progress of the last batch.
    pub fn last_progress(&self) -> Option<StreamingQueryProgress> {
        self.shared.read(|s| s.recent.back().cloned()).flatten()
    }

    /// The progress of the most recent batches, oldest first (at most 100).
    pub fn recent_progress(&self) -> Vec<StreamingQueryProgress> {
        self.shared
            .read(|s| s.recent.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// The error the query failed with, if it failed.
    pub fn exception(&self) -> Option<StreamingQueryException> {
        let cause = self.shared.read(|s| s.exception.clone()).flatten()?;
        Some(StreamingQueryException {
            id: self.id(),
            run_id: self.run_id(),
            cause,
        })
    }

    /// Stops the query after the batch in progress, and waits until it has stopped.
    pub async fn stop(&self) {
        self.shared.stop.send_replace(true);
        let task = self.task.lock().ok().and_then(|mut t| t.take());
        if let Some(t) = task {
            let _ = t.await;
        }
        self.shared.wait_for(|s| !s.active).await;
    }

    /// Waits until the query terminates; an error if it failed.
    pub async fn await_termination(&self) -> Result<(), StreamingQueryException> {
        self.shared.wait_for(|s| !s.active).await;
        match self.exception() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Like [`StreamingQuery::await_termination`], giving up after `timeout`: `Ok(false)` if
    /// the query is still running then.
    pub async fn await_termination_timeout(
        &self,
        timeout: Duration,
    ) -> Result<bool, StreamingQueryException> {
        match tokio::time::timeout(timeout, self.await_termination()).await {
            Ok(r) => r.map(|()| true),
            Err(_) => Ok(false),
        }
    }

    /// Waits until every row available in the sources when this is called has been processed
    /// (a trigger that started after the call found no new data), or the query terminated.
    /// Useful in tests; a source that never runs dry (rate) never lets it return.
    pub async fn process_all_available(&self) -> Result<(), StreamingQueryException> {
        let since = self.shared.read(|s| s.triggers).unwrap_or(0);
        self.shared
            .wait_for(|s| !s.active || s.last_idle_trigger > since)
            .await;
        match self.exception() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// The streaming queries of a session and their listeners (Spark's `spark.streams`).
#[derive(Debug, Clone)]
pub struct StreamingQueryManager {
    inner: Arc<ManagerInner>,
}

#[derive(Debug)]
pub(crate) struct ManagerInner {
    active: Mutex<BTreeMap<Uuid, StreamingQuery>>,
    pub(crate) bus: ListenerBus,
}

impl Default for StreamingQueryManager {
    fn default() -> Self {
        Self::new()
    }
}

impl StreamingQueryManager {
    /// A manager with no queries and no listeners.
    pub fn new() -> Self {
        Self {
            inner: Arc::new(ManagerInner {
                active: Mutex::new(BTreeMap::new()),
                bus: ListenerBus::new(),
            }),
        }
    }

    /// The active queries.
    pub fn active(&self) -> Vec<StreamingQuery> {
        self.inner
            .active
            .lock()
            .map(|a| a.values().cloned().collect())
            .unwrap_or_default()
    }

    /// The active query with `id`.
    pub fn get(&self, id: Uuid) -> Option<StreamingQuery> {
        self.inner.active.lock().ok()?.get(&id).cloned()
    }

    /// Adds a listener for every query of the session.
    pub fn add_listener(&self, listener: Arc<dyn StreamingQueryListener>) {
        self.inner.bus.add(listener);
    }

    /// Waits until every event of this session's queries so far has reached the listeners
    /// (they are delivered on a thread of their own). Useful before exiting.
    pub async fn flush_listeners(&self) {
        self.inner.bus.flush().await;
    }

    /// Removes a listener added before.
    pub fn remove_listener(&self, listener: &Arc<dyn StreamingQueryListener>) {
        self.inner.bus.remove(listener);
    }

    pub(crate) fn post(&self, event: Event) {
        self.inner.bus.post(event);
    }

    /// Registers a starting query; refuses a second active run of the same query ID.
    pub(crate) fn register(&self, q: &StreamingQuery) -> Result<(), Error> {
        let mut active = self
            .inner
            .active
            .lock()
            .map_err(|_| Error::Internal("query manager lock poisoned".into()))?;
        if active.contains_key(&q.id()) {
            return Err(Error::user(
                "CONCURRENT_QUERY",
                "0A000",
                format!(
                    "Cannot start query with id {}: another run of it is already active in this \
                     session. Stop it first.",
                    q.id()
                ),
            ));
        }
        active.insert(q.id(), q.clone());
        Ok(())
    }

    pub(crate) fn unregister(&self, id: Uuid) {
        if let Ok(mut a) = self.inner.active.lock() {
            a.remove(&id);
        }
    }
}
