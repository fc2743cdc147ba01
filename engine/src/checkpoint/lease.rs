//! The lease that lets one run at a time own a checkpoint on an object store (S3), where there
//! is no file lock: the object `.weir-lease` names its holder and an expiry. A run takes it with
//! a create-only put, or, once expired, with a put conditional on its ETag (If-Match); it renews
//! it the same way every third of its time to live; a run that finds it held and unexpired is
//! refused (`CONCURRENT_QUERY`). A run that loses it (a renewal fails because another run took
//! it, or it cannot renew before expiry) writes nothing more: its next log write is refused.
//!
//! The time to live is the price of a `kill -9`: the killed run's lease blocks a restart until
//! it expires (30 s by default, `WEIR_CHECKPOINT_LEASE_MS`). A clean stop deletes the lease.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use object_store::{ObjectStoreExt, PutMode, PutOptions, PutPayload, UpdateVersion};
use serde::{Deserialize, Serialize};
use uuid::Uuid;
use weir_common::Location;

use crate::{Error, Result};

/// The lease object, relative to the checkpoint.
pub const LEASE: &str = ".weir-lease";

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Body {
    query_id: Uuid,
    holder: Uuid,
    expires_at_ms: i64,
}

/// A held lease, renewed in the background until released.
#[derive(Debug)]
pub struct Lease {
    location: Location,
    lost: Arc<AtomicBool>,
    renewer: tokio::task::JoinHandle<()>,
}

fn ttl() -> Duration {
    std::env::var("WEIR_CHECKPOINT_LEASE_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(Duration::from_secs(30), Duration::from_millis)
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

fn body(query_id: Uuid, holder: Uuid, ttl: Duration) -> Result<PutPayload> {
    let b = Body {
        query_id,
        holder,
        expires_at_ms: now_ms() + ttl.as_millis() as i64,
    };
    Ok(PutPayload::from(
        serde_json::to_vec(&b).map_err(|e| Error::Internal(e.to_string()))?,
    ))
}

fn refused(location: &Location, query_id: Uuid, why: String) -> Error {
    Error::user(
        "CONCURRENT_QUERY",
        "0A000",
        format!(
            "Cannot start query with id {query_id}: another run of it holds the checkpoint \
             location '{}' ({why}). Stop that run first, or give this query a new checkpoint \
             location. If that run was killed, its lease expires by itself, or delete '{}/{LEASE}'.",
            location.display(),
            location.display()
        ),
    )
}

impl Lease {
    /// Takes the lease of the checkpoint at `location` for a run of `query_id`.
    pub async fn take(location: &Location, query_id: Uuid) -> Result<Self> {
        let ttl = ttl();
        let holder = Uuid::new_v4();
        let path = location.path(LEASE);
        let store = Arc::clone(location.store());
        let create = PutOptions {
            mode: PutMode::Create,
            ..Default::default()
        };
        let etag = match store
            .put_opts(&path, body(query_id, holder, ttl)?, create)
            .await
        {
            Ok(r) => r.e_tag,
            Err(object_store::Error::AlreadyExists { .. }) => {
                let current = store.get(&path).await?;
                let etag = current.meta.e_tag.clone();
                let held: Option<Body> = serde_json::from_slice(&current.bytes().await?).ok();
                if let Some(b) = &held
                    && b.expires_at_ms > now_ms()
                {
                    return Err(refused(
                        location,
                        query_id,
                        format!(
                            "its lease runs until {}",
                            chrono::DateTime::from_timestamp_millis(b.expires_at_ms)
                                .map(|t| t.to_rfc3339())
                                .unwrap_or_default()
                        ),
                    ));
                }
                // Expired (or unreadable): take it over, unless someone else does first.
                let over = PutOptions {
                    mode: PutMode::Update(UpdateVersion {
                        e_tag: etag,
                        version: None,
                    }),
                    ..Default::default()
                };
                match store
                    .put_opts(&path, body(query_id, holder, ttl)?, over)
                    .await
                {
                    Ok(r) => r.e_tag,
                    Err(object_store::Error::Precondition { .. }) => {
                        return Err(refused(
                            location,
                            query_id,
                            "it took the expired lease at the same moment".into(),
                        ));
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            Err(e) => return Err(e.into()),
        };
        let lost = Arc::new(AtomicBool::new(false));
        let renewer = tokio::spawn(renew(
            Arc::clone(location.store()),
            path,
            query_id,
            holder,
            etag,
            ttl,
            Arc::clone(&lost),
        ));
        Ok(Self {
            location: location.clone(),
            lost,
            renewer,
        })
    }

    /// Refuses when the lease was lost: another run may own the checkpoint now.
    pub fn check(&self) -> Result<()> {
        if self.lost.load(Ordering::Acquire) {
            return Err(Error::user(
                "CONCURRENT_QUERY",
                "0A000",
                format!(
                    "This run lost its lease on the checkpoint location '{}' (another run took \
                     it, or it could not be renewed in time); it stops without writing more.",
                    self.location.display()
                ),
            ));
        }
        Ok(())
    }

    /// Stops renewing and deletes the lease, so a restart need not wait for it to expire.
    pub async fn release(self) {
        self.renewer.abort();
        if !self.lost.load(Ordering::Acquire) {
            let _ = self.location.delete(LEASE).await;
        }
    }
}

async fn renew(
    store: Arc<dyn object_store::ObjectStore>,
    path: object_store::path::Path,
    query_id: Uuid,
    holder: Uuid,
    mut etag: Option<String>,
    ttl: Duration,
    lost: Arc<AtomicBool>,
) {
    let mut expires = now_ms() + ttl.as_millis() as i64;
    loop {
        tokio::time::sleep(ttl / 3).await;
        let Ok(payload) = body(query_id, holder, ttl) else {
            break;
        };
        let opts = PutOptions {
            mode: PutMode::Update(UpdateVersion {
                e_tag: etag.clone(),
                version: None,
            }),
            ..Default::default()
        };
        match store.put_opts(&path, payload, opts).await {
            Ok(r) => {
                etag = r.e_tag;
                expires = now_ms() + ttl.as_millis() as i64;
            }
            Err(object_store::Error::Precondition { .. }) => break,
            Err(e) => {
                tracing::warn!("cannot renew the checkpoint lease: {e}");
                if now_ms() >= expires {
                    break;
                }
            }
        }
    }
    tracing::error!("the checkpoint lease is lost; this run writes nothing more");
    lost.store(true, Ordering::Release);
}
