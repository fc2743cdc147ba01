//! Named sources and source evolution (Spark's
//! `spark.sql.streaming.queryEvolution.enableSourceEvolution`): with the setting on, every
//! source is named, the offsets log keys each source's range by its name, and a restart may
//! reorder sources, add one (it starts from its starting position) or remove one (for good:
//! its name cannot come back).
//!
//! ```text
//! offsets/N      {"start":..,"end":..,"source":"kafka:..","name":"orders_us"} per source
//! source_names   {"removed":["orders_eu"]}   names removed from the query, never re-added
//! sources/<name> a named source's private files (by position without evolution)
//! ```
//!
//! The checks are pure functions of what the checkpoint recorded and what the query has.

use std::collections::BTreeSet;

use weir_sources::Offset;

use crate::checkpoint::{OffsetEntry, SourceRange};
use crate::{Error, Result};

/// The conf key the setting is fixed under in the offsets log.
pub(crate) const SOURCE_EVOLUTION: &str = "weir.sql.streaming.queryEvolution.enableSourceEvolution";

/// The writer options that turn the setting on: weir's and Spark's configuration keys, and the
/// short form.
pub(crate) const OPTION_KEYS: [&str; 3] = [
    "queryEvolution.enableSourceEvolution",
    SOURCE_EVOLUTION,
    "spark.sql.streaming.queryEvolution.enableSourceEvolution",
];

/// One source of the query: its name (if given) and identity.
#[derive(Debug, Clone)]
pub(crate) struct QuerySource {
    pub(crate) name: Option<String>,
    pub(crate) identity: String,
}

/// Refuses duplicate source names, and, with source evolution, unnamed sources.
pub(crate) fn check_names(sources: &[QuerySource], evolution: bool) -> Result<()> {
    let mut seen = BTreeSet::new();
    for s in sources {
        if let Some(n) = &s.name
            && !seen.insert(n.as_str())
        {
            return Err(Error::user(
                "DUPLICATE_STREAMING_SOURCE_NAME",
                "42710",
                format!(
                    "Two sources of the query are named '{n}'; a source name identifies one \
                     source of the query. Give each its own name."
                ),
            ));
        }
    }
    if evolution {
        let unnamed: Vec<String> = sources
            .iter()
            .enumerate()
            .filter(|(_, s)| s.name.is_none())
            .map(|(i, s)| format!("{i} ({})", s.identity))
            .collect();
        if !unnamed.is_empty() {
            return Err(Error::user(
                "UNNAMED_STREAMING_SOURCES_WITH_ENFORCEMENT",
                "42601",
                format!(
                    "With source evolution on, every source must be named, so that its offsets \
                     can be found after sources are added, removed or reordered; source(s) {} \
                     have no name. Name them: .name(\"orders_us\") on the reader, or in SQL \
                     STREAM(source(...), name => 'orders_us').",
                    unnamed.join(", ")
                ),
            ));
        }
    }
    Ok(())
}

/// Refuses a restart that turns source evolution on or off: the checkpoint's offsets are kept
/// by name or by position from its first batch on.
pub(crate) fn check_setting(logged: Option<&str>, now: bool) -> Result<()> {
    let was = logged == Some("true");
    if was == now {
        return Ok(());
    }
    let what = if now {
        "The checkpoint was created without source evolution, so its offsets are kept by the \
         sources' positions; turning it on needs a new checkpoint location (the named sources \
         then start from their starting positions)."
    } else {
        "The checkpoint was created with source evolution, so its offsets are kept by source \
         name; it cannot be turned off for this checkpoint. Keep the setting on, or start the \
         query with a new checkpoint location."
    };
    Err(Error::user(
        "STREAMING_QUERY_EVOLUTION_SETTING_CHANGED",
        "42K03",
        what,
    ))
}

/// The restart check with source evolution: `logged` is the newest logged batch's ranges,
/// `removed` the names removed before. A source keeps its name's offsets if it is the same
/// source; a new name starts afresh unless it was removed before. Returns the names the query
/// no longer has (to record as removed).
pub(crate) fn check_named(
    logged: &[SourceRange],
    batch: u64,
    sources: &[QuerySource],
    removed: &BTreeSet<String>,
) -> Result<Vec<String>> {
    for s in sources {
        let Some(name) = &s.name else { continue };
        if removed.contains(name) {
            return Err(Error::user(
                "STREAMING_SOURCE_NAME_REMOVED",
                "42K03",
                format!(
                    "The source '{name}' was removed from this query by an earlier restart; a \
                     removed source cannot come back, as its offsets are gone. Give the source \
                     a new name (it then starts from its starting position), or start the query \
                     with a new checkpoint location."
                ),
            ));
        }
        let was = logged.iter().find(|r| r.name.as_deref() == Some(name));
        if let Some(SourceRange {
            source: Some(was), ..
        }) = was
            && *was != s.identity
        {
            return Err(Error::user(
                "STREAMING_QUERY_SOURCES_CHANGED",
                "42K03",
                format!(
                    "The source '{name}' is now '{}', but the checkpoint's batch {batch} read \
                     '{was}' under that name; its offsets cannot be read by another source. \
                     Give the new source a new name (it starts from its starting position), or \
                     undo the change.",
                    s.identity
                ),
            ));
        }
    }
    let now: BTreeSet<&str> = sources.iter().filter_map(|s| s.name.as_deref()).collect();
    Ok(logged
        .iter()
        .filter_map(|r| r.name.clone())
        .filter(|n| !now.contains(n.as_str()))
        .collect())
}

/// `entry` with its ranges in the query's order (`names`): an added source's range is empty,
/// at its initial offset, so a replayed batch reads nothing from it.
pub(crate) fn align(
    entry: &OffsetEntry,
    names: &[String],
    identities: &[String],
    initials: &[Offset],
) -> OffsetEntry {
    let sources = names
        .iter()
        .zip(identities)
        .zip(initials)
        .map(|((name, identity), initial)| {
            entry
                .sources
                .iter()
                .find(|r| r.name.as_deref() == Some(name))
                .cloned()
                .unwrap_or_else(|| SourceRange {
                    start: initial.clone(),
                    end: initial.clone(),
                    source: Some(identity.clone()),
                    name: Some(name.clone()),
                })
        })
        .collect();
    OffsetEntry {
        metadata: entry.metadata.clone(),
        sources,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::BatchMetadata;

    fn q(name: &str, identity: &str) -> QuerySource {
        QuerySource {
            name: Some(name.into()),
            identity: identity.into(),
        }
    }

    fn range(name: &str, identity: &str, end: i64) -> SourceRange {
        SourceRange {
            start: Offset(serde_json::json!(0)),
            end: Offset(serde_json::json!(end)),
            source: Some(identity.into()),
            name: Some(name.into()),
        }
    }

    fn class(r: Result<impl std::fmt::Debug>) -> String {
        match r {
            Err(e) => e.error_class().to_string(),
            Ok(v) => format!("{v:?}"),
        }
    }

    #[test]
    fn evolution_needs_every_source_named_and_names_unique() {
        let unnamed = QuerySource {
            name: None,
            identity: "rate".into(),
        };
        assert!(check_names(std::slice::from_ref(&unnamed), false).is_ok());
        assert_eq!(
            class(check_names(&[unnamed], true)),
            "UNNAMED_STREAMING_SOURCES_WITH_ENFORCEMENT"
        );
        assert_eq!(
            class(check_names(&[q("a", "rate"), q("a", "kafka")], false)),
            "DUPLICATE_STREAMING_SOURCE_NAME"
        );
    }

    #[test]
    fn the_setting_cannot_change_on_a_checkpoint() {
        assert!(check_setting(None, false).is_ok());
        assert!(check_setting(Some("true"), true).is_ok());
        assert_eq!(
            class(check_setting(None, true)),
            "STREAMING_QUERY_EVOLUTION_SETTING_CHANGED"
        );
        assert_eq!(
            class(check_setting(Some("true"), false)),
            "STREAMING_QUERY_EVOLUTION_SETTING_CHANGED"
        );
    }

    #[test]
    fn sources_are_matched_by_name_and_a_removed_name_stays_removed() {
        let logged = [range("us", "rate", 5), range("eu", "kafka:eu", 7)];
        // Reordered, one added, one removed.
        let now = [q("new", "rate"), q("us", "rate")];
        let removed = check_named(&logged, 3, &now, &BTreeSet::new()).unwrap();
        assert_eq!(removed, ["eu"]);
        // Another source behind a kept name.
        assert_eq!(
            class(check_named(
                &logged,
                3,
                &[q("us", "kafka:us")],
                &BTreeSet::new()
            )),
            "STREAMING_QUERY_SOURCES_CHANGED"
        );
        assert_eq!(
            class(check_named(
                &[range("us", "rate", 5)],
                4,
                &[q("eu", "kafka:eu")],
                &BTreeSet::from(["eu".to_string()])
            )),
            "STREAMING_SOURCE_NAME_REMOVED"
        );

        let entry = OffsetEntry {
            metadata: BatchMetadata {
                batch_watermark_ms: 0,
                batch_timestamp_ms: 0,
                conf: Default::default(),
            },
            sources: logged.to_vec(),
        };
        let initial = Offset(serde_json::json!(-1));
        let aligned = align(
            &entry,
            &["new".into(), "us".into()],
            &["rate".into(), "rate".into()],
            &[initial.clone(), initial.clone()],
        );
        assert_eq!(
            aligned.sources[0].end, initial,
            "an added source starts afresh"
        );
        assert_eq!(aligned.sources[0].start, initial);
        assert_eq!(
            aligned.sources[1], logged[0],
            "a kept source keeps its offsets"
        );
    }
}
