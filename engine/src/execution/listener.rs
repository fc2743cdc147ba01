//! Query lifecycle events and the listener bus that delivers them on a thread of its own, so a
//! slow listener never slows a query.

use std::panic::AssertUnwindSafe;
use std::sync::mpsc;
use std::sync::{Arc, RwLock};

use uuid::Uuid;

use crate::StreamingQueryProgress;

/// A query started (`onQueryStarted`).
#[derive(Debug, Clone)]
pub struct QueryStartedEvent {
    /// The query's ID.
    pub id: Uuid,
    /// This run's ID.
    pub run_id: Uuid,
    /// The query name.
    pub name: Option<String>,
    /// When it started.
    pub timestamp: String,
}

/// A batch finished (`onQueryProgress`).
#[derive(Debug, Clone)]
pub struct QueryProgressEvent {
    /// The batch's progress record.
    pub progress: StreamingQueryProgress,
}

/// The query has had no new data for a while (`onQueryIdle`).
#[derive(Debug, Clone)]
pub struct QueryIdleEvent {
    /// The query's ID.
    pub id: Uuid,
    /// This run's ID.
    pub run_id: Uuid,
    /// When the idle trigger started.
    pub timestamp: String,
}

/// The query stopped (`onQueryTerminated`).
#[derive(Debug, Clone)]
pub struct QueryTerminatedEvent {
    /// The query's ID.
    pub id: Uuid,
    /// This run's ID.
    pub run_id: Uuid,
    /// The error it failed with, if it failed.
    pub exception: Option<String>,
    /// The error class of that error.
    pub error_class_on_exception: Option<String>,
}

/// Receives the lifecycle events of every query of a session. Methods run on the listener
/// thread, one event at a time, in order.
pub trait StreamingQueryListener: Send + Sync {
    /// A query started.
    fn on_query_started(&self, _event: &QueryStartedEvent) {}
    /// A batch finished.
    fn on_query_progress(&self, _event: &QueryProgressEvent) {}
    /// A query is idle.
    fn on_query_idle(&self, _event: &QueryIdleEvent) {}
    /// A query stopped.
    fn on_query_terminated(&self, _event: &QueryTerminatedEvent) {}
}

/// An event on the bus.
#[derive(Debug)]
pub(crate) enum Event {
    Started(QueryStartedEvent),
    Progress(Box<QueryProgressEvent>),
    Idle(QueryIdleEvent),
    Terminated(QueryTerminatedEvent),
    /// Answered once every event posted before it has been delivered.
    Flush(tokio::sync::oneshot::Sender<()>),
}

type Listeners = Arc<RwLock<Vec<Arc<dyn StreamingQueryListener>>>>;

/// Delivers events to listeners on a dedicated thread. The thread ends when the bus is
/// dropped.
pub(crate) struct ListenerBus {
    tx: mpsc::Sender<Event>,
    listeners: Listeners,
}

impl std::fmt::Debug for ListenerBus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ListenerBus")
    }
}

impl ListenerBus {
    pub(crate) fn new() -> Self {
        let (tx, rx) = mpsc::channel::<Event>();
        let listeners: Listeners = Arc::new(RwLock::new(vec![]));
        let ls = Arc::clone(&listeners);
        let spawned = std::thread::Builder::new()
            .name("weir-listener-bus".into())
            .spawn(move || {
                while let Ok(event) = rx.recv() {
                    if let Event::Flush(done) = event {
                        let _ = done.send(());
                        continue;
                    }
                    let current: Vec<_> = ls.read().map(|l| l.clone()).unwrap_or_default();
                    for l in current {
                        // A panicking listener must not take the bus down with it.
                        let _ = std::panic::catch_unwind(AssertUnwindSafe(|| match &event {
                            Event::Started(e) => l.on_query_started(e),
                            Event::Progress(e) => l.on_query_progress(e),
                            Event::Idle(e) => l.on_query_idle(e),
                            Event::Terminated(e) => l.on_query_terminated(e),
                            Event::Flush(_) => {}
                        }));
                    }
                }
            });
        if let Err(e) = spawned {
            tracing::error!("cannot start the listener thread: {e}");
        }
        Self { tx, listeners }
    }

    pub(crate) fn post(&self, event: Event) {
        let _ = self.tx.send(event);
    }

    /// Waits until every event posted so far has reached the listeners.
    pub(crate) async fn flush(&self) {
        let (done, wait) = tokio::sync::oneshot::channel();
        if self.tx.send(Event::Flush(done)).is_ok() {
            let _ = wait.await;
        }
    }

    pub(crate) fn add(&self, l: Arc<dyn StreamingQueryListener>) {
        if let Ok(mut ls) = self.listeners.write() {
            ls.push(l);
        }
    }

    pub(crate) fn remove(&self, l: &Arc<dyn StreamingQueryListener>) {
        if let Ok(mut ls) = self.listeners.write() {
            ls.retain(|x| !Arc::ptr_eq(x, l));
        }
    }
}
