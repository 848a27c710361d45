//! The same behaviour of both backends: Qdrant's engine in-process always, a Qdrant server
//! when `QDRANT_URL` names one (without it those tests are listed as ignored, saying so).

#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is a failed test.

use std::{sync::Arc, time::Duration};

use serde_json::{Map, Value, json};
use toolmesh_core::{
    ErrorCode, StoreError, VectorStore,
    vector::{CollectionSpec, Condition, Filter, Point, Precision, Query, Scalar, SparseVector},
};
use toolmesh_vector::{EmbeddedStore, ServerStore, Timeouts};

fn temp_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("toolmesh-vector-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn spec(name: &str) -> CollectionSpec {
    CollectionSpec {
        name: name.to_owned(),
        dense_size: Some(4),
        precision: Precision::Full,
        lexical: true,
        keyword_fields: vec!["doc".into()],
    }
}

fn payload(doc: &str, chunk: i64) -> Map<String, Value> {
    let Value::Object(map) = json!({ "doc": doc, "chunk": chunk, "tags": ["x", doc] }) else {
        unreachable!()
    };
    map
}

fn unit(v: [f32; 4]) -> Vec<f32> {
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    v.iter().map(|x| x / norm).collect()
}

fn terms(ids: &[u32]) -> SparseVector {
    SparseVector { indices: ids.to_vec(), values: vec![1.0; ids.len()] }
}

fn point(id: u64, dense: [f32; 4], lexical: &[u32], doc: &str, chunk: i64) -> Point {
    Point {
        id,
        dense: Some(unit(dense)),
        lexical: Some(terms(lexical)),
        payload: payload(doc, chunk),
    }
}

fn query(dense: Option<[f32; 4]>, lexical: Option<&[u32]>, limit: usize) -> Query {
    Query {
        dense: dense.map(unit),
        lexical: lexical.map(terms),
        filter: None,
        limit,
        candidates: 10,
        rrf_k: 0,
        payload: true,
    }
}

fn ids(hits: &[toolmesh_core::vector::Hit]) -> Vec<u64> {
    hits.iter().map(|h| h.id).collect()
}

/// Everything a backend must do, on a fresh collection named `name`.
async fn behaves(store: Arc<dyn VectorStore>, name: &str) {
    let spec = spec(name);
    store.ensure(&spec).await.unwrap();
    store.ensure(&spec).await.unwrap();
    let other = CollectionSpec { dense_size: Some(8), ..spec.clone() };
    if store.backend() == "embedded" {
        let refused = store.ensure(&other).await.unwrap_err();
        assert_eq!(refused.code(), ErrorCode::InvalidArgument, "{refused}");
    }

    store
        .upsert(
            name,
            vec![
                point(1, [1.0, 0.0, 0.0, 0.0], &[10, 11], "a", 0),
                point(2, [0.0, 1.0, 0.0, 0.0], &[12], "a", 1),
                point(3, [0.0, 0.0, 1.0, 0.0], &[13, 10], "b", 0),
                point(4, [0.0, 0.0, 0.0, 1.0], &[14], "c", 0),
            ],
        )
        .await
        .unwrap();
    assert_eq!(store.count(name, None).await.unwrap(), 4);
    assert_eq!(
        store.count(name, Some(Filter::is("doc", Scalar::Str("a".into())))).await.unwrap(),
        2
    );
    assert_eq!(store.distinct(name, "doc", 100).await.unwrap(), 3);

    // Read back by id, with the vectors when asked.
    let records = store.retrieve(name, vec![2, 99], true).await.unwrap();
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].payload["doc"], "a");
    let dense = records[0].dense.as_ref().expect("the dense vector");
    assert!((dense[1] - 1.0).abs() < 1e-5, "{dense:?}");
    assert_eq!(records[0].lexical, Some(terms(&[12])));
    let bare = &store.retrieve(name, vec![3], false).await.unwrap()[0];
    assert!(bare.dense.is_none() && bare.lexical.is_none(), "{bare:?}");

    // Dense, lexical and fused rankings.
    let dense = store.query(name, query(Some([0.1, 0.0, 1.0, 0.0]), None, 2)).await.unwrap();
    assert_eq!(ids(&dense), [3, 1]);
    let lexical = store.query(name, query(None, Some(&[14]), 3)).await.unwrap();
    assert_eq!(ids(&lexical), [4]);
    // Terms 10 and 11 are both in point 1, 10 alone in 3, and the vector is nearest 1: 1
    // leads both lists, 3 is second in both.
    let fused =
        store.query(name, query(Some([1.0, 0.0, 0.2, 0.0]), Some(&[10, 11]), 2)).await.unwrap();
    assert_eq!(ids(&fused), [1, 3]);
    assert!(fused[0].score >= fused[1].score);
    // Hits carry their payload when asked, and only then; the ranking is the same.
    assert!(fused.iter().all(|hit| !hit.payload.is_empty()), "{fused:?}");
    let bare = Query { payload: false, ..query(Some([1.0, 0.0, 0.2, 0.0]), Some(&[10, 11]), 2) };
    let bare = store.query(name, bare).await.unwrap();
    assert_eq!(ids(&bare), [1, 3]);
    assert!(bare.iter().all(|hit| hit.payload.is_empty()), "{bare:?}");

    // Filters: keep, keep any, exclude; and on an array field.
    let mut filtered = query(Some([1.0, 0.0, 0.0, 0.0]), Some(&[10]), 4);
    filtered.filter = Some(Filter::is("doc", Scalar::Str("b".into())));
    assert_eq!(ids(&store.query(name, filtered.clone()).await.unwrap()), [3]);
    filtered.filter = Some(Filter {
        must: vec![toolmesh_core::vector::Condition::In(
            "doc".into(),
            vec![Scalar::Str("b".into()), Scalar::Str("c".into())],
        )],
        must_not: vec![toolmesh_core::vector::Condition::Is("chunk".into(), Scalar::Int(5))],
    });
    let mut found = ids(&store.query(name, filtered.clone()).await.unwrap());
    found.sort();
    assert_eq!(found, [3, 4]);
    filtered.filter = Some(Filter::is("tags", Scalar::Str("c".into())));
    assert_eq!(ids(&store.query(name, filtered).await.unwrap()), [4]);

    // Replacing a document's points leaves none of the old ones.
    store
        .replace(
            name,
            Filter::is("doc", Scalar::Str("a".into())),
            vec![point(20, [1.0, 1.0, 0.0, 0.0], &[15], "a", 0)],
        )
        .await
        .unwrap();
    assert_eq!(
        store.count(name, Some(Filter::is("doc", Scalar::Str("a".into())))).await.unwrap(),
        1
    );
    assert!(store.retrieve(name, vec![1, 2], false).await.unwrap().is_empty());
    assert_eq!(store.count(name, None).await.unwrap(), 3);

    // Deleting by id; unknown ids are ignored.
    store.delete(name, vec![4, 1234]).await.unwrap();
    assert_eq!(store.count(name, None).await.unwrap(), 2);
    assert!(store.query(name, query(None, Some(&[14]), 3)).await.unwrap().is_empty());

    // Deleting by field and id: every point of "a" or "b" but 20, with nothing stored.
    let others = Filter {
        must: vec![toolmesh_core::vector::Condition::In(
            "doc".into(),
            vec![Scalar::Str("a".into()), Scalar::Str("b".into())],
        )],
        must_not: vec![toolmesh_core::vector::Condition::HasId(vec![20])],
    };
    store.replace(name, others, Vec::new()).await.unwrap();
    assert!(store.retrieve(name, vec![3], false).await.unwrap().is_empty());
    assert_eq!(store.retrieve(name, vec![20], false).await.unwrap().len(), 1);
    assert_eq!(store.count(name, None).await.unwrap(), 1);

    // A point may come without its dense vector and get it later.
    let lexical_only =
        Point { id: 30, dense: None, lexical: Some(terms(&[16])), payload: payload("d", 0) };
    store.upsert(name, vec![lexical_only]).await.unwrap();
    assert_eq!(ids(&store.query(name, query(None, Some(&[16]), 1)).await.unwrap()), [30]);
    let by_vector = store.query(name, query(Some([0.0, 0.0, 0.0, 1.0]), None, 5)).await.unwrap();
    assert!(!ids(&by_vector).contains(&30), "{by_vector:?}");
    // Ids are listed without reading the points, all or those a filter keeps: here the
    // points with and without their dense vector.
    let mut all = store.ids(name, None).await.unwrap();
    all.sort();
    assert_eq!(all, [20, 30]);
    let has_dense = |has: bool| {
        let condition = vec![Condition::HasVector(toolmesh_core::vector::DENSE.into())];
        let (must, must_not) = if has { (condition, vec![]) } else { (vec![], condition) };
        Some(Filter { must, must_not })
    };
    assert_eq!(store.ids(name, has_dense(true)).await.unwrap(), [20]);
    assert_eq!(store.ids(name, has_dense(false)).await.unwrap(), [30]);
    store.upsert(name, vec![point(30, [0.0, 0.0, 0.0, 1.0], &[16], "d", 0)]).await.unwrap();
    let by_vector = store.query(name, query(Some([0.0, 0.0, 0.0, 1.0]), None, 1)).await.unwrap();
    assert_eq!(ids(&by_vector), [30]);
    assert_eq!(store.count(name, None).await.unwrap(), 2);

    // Errors name the store and the collection.
    let missing = store.query("no-such-collection", query(None, Some(&[1]), 1)).await.unwrap_err();
    assert_eq!(missing.code(), ErrorCode::NotFound, "{missing}");
    let wrong =
        store.query(name, Query { dense: Some(vec![1.0; 3]), ..query(None, None, 1) }).await;
    assert_eq!(wrong.unwrap_err().code(), ErrorCode::InvalidArgument);
    store.check().await.unwrap();

    half_precision(store.as_ref(), &format!("{name}-half")).await;
}

/// A collection of half-precision vectors ranks as one of full precision, reads its vectors
/// back within half precision's error, and is deleted whole.
async fn half_precision(store: &dyn VectorStore, name: &str) {
    let spec = CollectionSpec { precision: Precision::Half, ..spec(name) };
    store.ensure(&spec).await.unwrap();
    if store.backend() == "embedded" {
        let full = CollectionSpec { precision: Precision::Full, ..spec.clone() };
        let refused = store.ensure(&full).await.unwrap_err();
        assert_eq!(refused.code(), ErrorCode::InvalidArgument, "{refused}");
        assert!(refused.to_string().contains("at half precision"), "{refused}");
    }
    let stored = point(1, [0.3, 0.7, 0.1, 0.2], &[10], "a", 0);
    store
        .upsert(
            name,
            vec![
                stored.clone(),
                point(2, [0.0, 1.0, 0.0, 0.0], &[11], "a", 1),
                point(3, [0.0, 0.0, 1.0, 0.0], &[10], "b", 0),
            ],
        )
        .await
        .unwrap();
    let dense = store.query(name, query(Some([0.1, 0.0, 1.0, 0.0]), None, 2)).await.unwrap();
    assert_eq!(ids(&dense), [3, 1]);
    let fused = store.query(name, query(Some([0.3, 0.7, 0.1, 0.2]), Some(&[10]), 3)).await.unwrap();
    assert_eq!(ids(&fused)[0], 1);
    let read = &store.retrieve(name, vec![1], true).await.unwrap()[0];
    let (held, given) = (read.dense.as_ref().unwrap(), stored.dense.as_ref().unwrap());
    assert!(held.iter().zip(given).all(|(h, g)| (h - g).abs() < 1e-3), "{held:?} {given:?}");
    assert_eq!(read.lexical, stored.lexical);

    store.delete_collection(name).await.unwrap();
    let gone = store.count(name, None).await.unwrap_err();
    assert_eq!(gone.code(), ErrorCode::NotFound, "{gone}");
    // Deleting what is not there is done already.
    store.delete_collection(name).await.unwrap();
    // Made again, it starts empty.
    store.ensure(&spec).await.unwrap();
    assert_eq!(store.count(name, None).await.unwrap(), 0);
    store.delete_collection(name).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_embedded_engine_behaves_and_keeps_its_collections_across_a_reopen() {
    let dir = temp_dir("behaves");
    let store: Arc<dyn VectorStore> = Arc::new(EmbeddedStore::open(&dir).await.unwrap());
    assert_eq!(store.backend(), "embedded");
    assert!(!store.shared());
    behaves(store.clone(), "docs").await;
    // A deleted collection stays deleted across the reopen.
    store.ensure(&spec("deleted")).await.unwrap();
    store.upsert("deleted", vec![point(1, [1.0, 0.0, 0.0, 0.0], &[10], "a", 0)]).await.unwrap();
    store.delete_collection("deleted").await.unwrap();
    let half = CollectionSpec { precision: Precision::Half, ..spec("half") };
    store.ensure(&half).await.unwrap();
    // An odd name still gets a directory of its own.
    behaves(store.clone(), "docs/../x y").await;
    // While it is open, no other store opens its directory.
    let taken = EmbeddedStore::open(&dir).await.unwrap_err();
    assert_eq!(taken.code(), ErrorCode::Unavailable, "{taken}");
    assert!(taken.to_string().contains("another toolmesh process"), "{taken}");
    drop(store);

    let reopened = EmbeddedStore::open(&dir).await.unwrap();
    assert_eq!(reopened.count("docs", None).await.unwrap(), 2);
    assert_eq!(reopened.count("docs/../x y", None).await.unwrap(), 2);
    let found = reopened.query("docs", query(None, Some(&[15]), 1)).await.unwrap();
    assert_eq!(ids(&found), [20]);
    // A collection reopened still refuses vectors of another size.
    let refused = reopened.ensure(&CollectionSpec { dense_size: Some(3), ..spec("docs") }).await;
    assert_eq!(refused.unwrap_err().code(), ErrorCode::InvalidArgument);
    let deleted = reopened.count("deleted", None).await.unwrap_err();
    assert_eq!(deleted.code(), ErrorCode::NotFound, "{deleted}");
    // A collection keeps its precision across the reopen.
    reopened.ensure(&half).await.unwrap();
    let full = reopened.ensure(&CollectionSpec { precision: Precision::Full, ..half }).await;
    assert_eq!(full.unwrap_err().code(), ErrorCode::InvalidArgument);
    // Closed, it lets go of the directory even while still referenced, and refuses work.
    reopened.close().await;
    let closed = reopened.count("docs", None).await.unwrap_err();
    assert_eq!(closed.code(), ErrorCode::Unavailable, "{closed}");
    let again = EmbeddedStore::open(&dir).await.unwrap();
    assert_eq!(again.count("docs", None).await.unwrap(), 2);
    drop((reopened, again));
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_sees_a_replaced_document_whole_never_half() {
    let dir = temp_dir("replace");
    let store = Arc::new(EmbeddedStore::open(&dir).await.unwrap());
    store.ensure(&spec("docs")).await.unwrap();
    let version = |generation: u64, chunks: u64| -> Vec<Point> {
        (0..chunks)
            .map(|c| point(generation * 100 + c, [1.0, 0.5, 0.0, 0.0], &[10], "a", c as i64))
            .collect()
    };
    store.upsert("docs", version(1, 5)).await.unwrap();
    let writer = {
        let store = store.clone();
        tokio::spawn(async move {
            for generation in 2..40 {
                let chunks = if generation % 2 == 0 { 3 } else { 5 };
                store
                    .replace(
                        "docs",
                        Filter::is("doc", Scalar::Str("a".into())),
                        version(generation, chunks),
                    )
                    .await
                    .unwrap();
            }
        })
    };
    let mut seen = 0;
    while !writer.is_finished() {
        let mut q = query(Some([1.0, 0.5, 0.0, 0.0]), Some(&[10]), 50);
        q.candidates = 50;
        let hits = store.query("docs", q).await.unwrap();
        let generations: std::collections::HashSet<u64> = hits.iter().map(|h| h.id / 100).collect();
        assert_eq!(generations.len(), 1, "a query saw two versions of one document: {hits:?}");
        let expected = if hits[0].id / 100 % 2 == 0 { 3 } else { 5 };
        assert_eq!(hits.len(), expected, "{hits:?}");
        seen += 1;
    }
    writer.await.unwrap();
    assert!(seen > 0);
    drop(store);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn an_unreachable_server_fails_fast_with_unavailable_naming_it() {
    // Nothing listens on port 1 of the loopback address; with a short timeout and with
    // the shipped default.
    let default = toolmesh_vector::VectorConfig::default().timeouts();
    let short = Timeouts { read: Duration::from_millis(500), write: Duration::from_millis(500) };
    for timeouts in [short, default] {
        let store = ServerStore::connect("http://127.0.0.1:1", None, timeouts).unwrap();
        let started = std::time::Instant::now();
        for error in [
            store.check().await.unwrap_err(),
            store.query("tools", query(None, Some(&[1]), 1)).await.unwrap_err(),
            store.ensure(&spec("tools")).await.unwrap_err(),
            store
                .upsert("tools", vec![point(1, [1.0, 0.0, 0.0, 0.0], &[1], "a", 0)])
                .await
                .unwrap_err(),
        ] {
            assert_eq!(error.code(), ErrorCode::Unavailable, "{error}");
            assert!(error.to_string().contains("qdrant at http://127.0.0.1:1"), "{error}");
            assert!(matches!(error, StoreError::Unavailable { .. }));
        }
        assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
    }
}

#[tokio::test]
async fn a_server_that_does_not_answer_fails_reads_and_writes_at_their_own_deadlines() {
    // A listener that accepts connections and never says a word.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let silent = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((connection, _)) = listener.accept().await {
            held.push(connection);
        }
    });
    let timeouts =
        Timeouts { read: Duration::from_millis(300), write: Duration::from_millis(1500) };
    let store = ServerStore::connect(&url, None, timeouts).unwrap();

    let started = std::time::Instant::now();
    let error = store.query("tools", query(None, Some(&[1]), 1)).await.unwrap_err();
    let read = started.elapsed();
    assert_eq!(error.code(), ErrorCode::Unavailable, "{error}");
    assert!(read >= Duration::from_millis(250) && read < Duration::from_millis(1200), "{read:?}");

    let started = std::time::Instant::now();
    let error = store
        .upsert("tools", vec![point(1, [1.0, 0.0, 0.0, 0.0], &[1], "a", 0)])
        .await
        .unwrap_err();
    let write = started.elapsed();
    assert_eq!(error.code(), ErrorCode::Unavailable, "{error}");
    assert!(error.to_string().contains(&format!("qdrant at {url}")), "{error}");
    assert!(write >= Duration::from_millis(1400) && write < Duration::from_secs(5), "{write:?}");
    silent.abort();
}

#[tokio::test]
#[cfg_attr(not(qdrant_url), ignore = "QDRANT_URL is not set: no Qdrant server to test against")]
async fn a_qdrant_server_behaves_like_the_embedded_engine() {
    let url = std::env::var("QDRANT_URL").expect("QDRANT_URL");
    let key = std::env::var("QDRANT_API_KEY").ok();
    let store: Arc<dyn VectorStore> = Arc::new(
        ServerStore::connect(
            &url,
            key,
            Timeouts { read: Duration::from_secs(10), write: Duration::from_secs(10) },
        )
        .unwrap(),
    );
    let name = format!("toolmesh-behaviour-{}", std::process::id());
    assert!(store.shared());
    behaves(store.clone(), &name).await;
    store.delete_collection(&name).await.unwrap();
}
