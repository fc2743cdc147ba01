//! The contract every state store provider meets, as one test run against each backend.

use crate::{KeyRange, KeyShape, StateStoreProvider, StoreId, WriteBatch};

fn batch(ops: &[(&str, Option<&str>)]) -> WriteBatch {
    let mut b = WriteBatch::new();
    for (k, v) in ops {
        match v {
            Some(v) => b.put(k.as_bytes(), v.as_bytes()),
            None => b.delete(k.as_bytes()),
        }
    }
    b
}

fn strings(pairs: Vec<(Vec<u8>, Vec<u8>)>) -> Vec<(String, String)> {
    pairs
        .into_iter()
        .map(|(k, v)| (String::from_utf8(k).unwrap(), String::from_utf8(v).unwrap()))
        .collect()
}

/// Versions, batched reads and writes, ordered range scans, replay and purge.
pub(crate) fn check(provider: &dyn StateStoreProvider, purges_at_once: bool) {
    let id = StoreId::new(0, 1, "default");
    let other = StoreId::new(0, 2, "default");

    // Version 0 is empty; writes are visible before commit and durable after it.
    let mut s = provider.open(&id, 0).unwrap();
    assert_eq!(s.version(), 0);
    s.apply(batch(&[
        ("b", Some("2")),
        ("a", Some("1")),
        ("c", Some("3")),
    ]))
    .unwrap();
    assert_eq!(
        s.multi_get(&[b"a", b"z", b"c"]).unwrap(),
        vec![Some(b"1".to_vec()), None, Some(b"3".to_vec())]
    );
    assert_eq!(s.commit().unwrap(), 1);
    assert_eq!(s.metrics().num_keys, 3);

    // Version 2: an update, a delete, a later op on the same key wins.
    let mut s = provider.open(&id, 1).unwrap();
    s.apply(batch(&[
        ("a", Some("10")),
        ("b", None),
        ("d", Some("x")),
        ("d", Some("4")),
    ]))
    .unwrap();
    assert_eq!(s.commit().unwrap(), 2);
    // Exact: an update adds nothing, a delete removes one, a new key adds one.
    assert_eq!(s.metrics().num_keys, 3);
    // A writer that states the change in keys gets the same count.
    let counted = StoreId::new(0, 3, "default");
    let mut s = provider.open(&counted, 0).unwrap();
    s.apply(batch(&[("x", Some("1")), ("y", Some("2"))]).with_key_delta(2))
        .unwrap();
    s.apply(batch(&[("x", None)]).with_key_delta(-1)).unwrap();
    s.commit().unwrap();
    assert_eq!(s.metrics().num_keys, 1);

    // Scans are in byte order and honour bounds.
    let at2 = vec![
        ("a".to_string(), "10".to_string()),
        ("c".into(), "3".into()),
        ("d".into(), "4".into()),
    ];
    let s2 = provider.open(&id, 2).unwrap();
    assert_eq!(strings(s2.scan(&KeyRange::all()).unwrap()), at2);
    assert_eq!(
        strings(s2.scan(&KeyRange::below(b"d".to_vec())).unwrap()),
        at2[..2].to_vec()
    );
    let inclusive = KeyRange {
        start: std::ops::Bound::Excluded(b"a".to_vec()),
        end: std::ops::Bound::Included(b"c".to_vec()),
    };
    assert_eq!(strings(s2.scan(&inclusive).unwrap()), at2[1..2].to_vec());
    drop(s2);

    check_prefix_scans(provider);

    // Older versions stay readable until purged; stores do not see each other. (A store has
    // one live instance at a time: each check opens afresh.)
    let s1 = provider.open(&id, 1).unwrap();
    assert_eq!(s1.multi_get(&[b"b"]).unwrap(), vec![Some(b"2".to_vec())]);
    drop(s1);
    let o = provider.open(&other, 0).unwrap();
    assert!(o.scan(&KeyRange::all()).unwrap().is_empty());
    drop(o);

    // A replay of version 2 from version 1 (a batch re-run after a crash) gives the same state.
    let mut again = provider.open(&id, 1).unwrap();
    again
        .apply(batch(&[("a", Some("10")), ("b", None), ("d", Some("4"))]))
        .unwrap();
    assert_eq!(again.commit().unwrap(), 2);
    drop(again);
    assert_eq!(
        strings(
            provider
                .open(&id, 2)
                .unwrap()
                .scan(&KeyRange::all())
                .unwrap()
        ),
        at2
    );

    // Uncommitted writes are lost with the store instance.
    let mut lost = provider.open(&id, 2).unwrap();
    lost.apply(batch(&[("e", Some("5"))])).unwrap();
    drop(lost);
    assert_eq!(
        provider.open(&id, 2).unwrap().multi_get(&[b"e"]).unwrap(),
        vec![None]
    );

    // Purged versions are gone, with an error that says so; newer ones stay. (A provider that
    // rebuilds from snapshots keeps everything until it has a snapshot to rebuild from.)
    provider.purge_below(&id, 2).unwrap();
    if purges_at_once {
        let err = provider.open(&id, 1).err().unwrap();
        assert_eq!(err.error_class(), "STATE_STORE_VERSION_NOT_FOUND", "{err}");
        assert!(err.to_string().contains("0/1/default"), "{err}");
    } else {
        assert!(provider.open(&id, 1).is_ok());
    }
    assert!(provider.open(&id, 2).is_ok());
    // A version never written is an error too, except the empty version 0 of a new store.
    assert!(provider.open(&other, 5).is_err());
}

/// What [`crate::StateStore::scan_prefixes`] visits in `provider`'s store `id`, asked for
/// `prefixes`: (prefix index, key, value) each.
fn prefix_scan(s: &dyn crate::StateStore, prefixes: &[&str]) -> Vec<(usize, String, String)> {
    let prefixes: Vec<&[u8]> = prefixes.iter().map(|p| p.as_bytes()).collect();
    let mut seen = vec![];
    s.scan_prefixes(&prefixes, &mut |i, k, v| {
        seen.push((
            i,
            String::from_utf8(k.to_vec()).unwrap(),
            String::from_utf8(v.to_vec()).unwrap(),
        ))
    })
    .unwrap();
    seen
}

/// Prefix scans, in a store of join-like keys (a two-byte prefix and an eight-byte suffix) and
/// in an opaque one: committed and staged writes of each prefix asked for, in prefix and key
/// order, deletes left out, absent and repeated prefixes.
fn check_prefix_scans(provider: &dyn StateStoreProvider) {
    let rows = StoreId::new(0, 4, "rows");
    let shape = KeyShape::Prefixed { suffix: 8 };
    let mut s = provider.open_shaped(&rows, 0, shape).unwrap();
    s.apply(batch(&[
        ("k1-0000001", Some("a")),
        ("k1-0000002", Some("b")),
        ("k2-0000001", Some("c")),
        ("k3-0000001", Some("d")),
    ]))
    .unwrap();
    s.commit().unwrap();
    drop(s);
    let mut s = provider.open_shaped(&rows, 1, shape).unwrap();
    s.apply(batch(&[
        ("k1-0000001", None),
        ("k2-0000000", Some("e")),
        ("k3-0000001", Some("f")),
        ("k4-0000001", Some("g")),
    ]))
    .unwrap();
    let want = |i: usize, k: &str, v: &str| (i, k.to_string(), v.to_string());
    assert_eq!(
        prefix_scan(s.as_ref(), &["k3", "k1", "k4", "k5", "k2", "k1"]),
        vec![
            want(1, "k1-0000002", "b"),
            want(5, "k1-0000002", "b"),
            want(4, "k2-0000000", "e"),
            want(4, "k2-0000001", "c"),
            want(0, "k3-0000001", "f"),
            want(2, "k4-0000001", "g"),
        ]
    );
    assert!(prefix_scan(s.as_ref(), &[]).is_empty());
    s.commit().unwrap();
    drop(s);
    // Opened without its shape, the store reads as an opaque one: any leading bytes are a
    // prefix.
    let s = provider.open(&rows, 2).unwrap();
    assert_eq!(
        prefix_scan(s.as_ref(), &["k2", "k0"]),
        vec![want(0, "k2-0000000", "e"), want(0, "k2-0000001", "c")]
    );
    assert_eq!(prefix_scan(s.as_ref(), &["k"]).len(), 5);
    drop(s);

    // In an opaque store a prefix is any leading bytes of a key.
    let opaque = StoreId::new(0, 5, "default");
    let mut s = provider.open(&opaque, 0).unwrap();
    s.apply(batch(&[
        ("a", Some("1")),
        ("ab", Some("2")),
        ("b", Some("3")),
    ]))
    .unwrap();
    assert_eq!(
        prefix_scan(s.as_ref(), &["a", "ab", "c"]),
        vec![want(0, "a", "1"), want(0, "ab", "2"), want(1, "ab", "2")]
    );
    s.commit().unwrap();
}
