//! Smoke test: the in-process P1 (and its baseline) on a small closure
//! gives sane figures on each engine. No timing assertions.

use crate::spec::{Engine, RowSpec, Scenario, Shape, WriteFigures};

fn p1_spec(engine: Engine, n: u64) -> RowSpec {
    RowSpec {
        scenario: Scenario::P1,
        engine,
        n,
        regions: 1,
        shape: Some(Shape::Flat),
        samples: 0,
        baseline_of: None,
        deleted: None,
        tick_ms: 50,
    }
}

async fn smoke(engine: Engine) {
    let n = 200;
    let spec = p1_spec(engine, n);
    let row = crate::local::p1(&spec).await.expect("p1 runs");
    assert_eq!(row.error, None);
    assert_eq!(row.operation_state.as_deref(), Some("SUCCEEDED"), "{row:?}");
    assert_eq!(row.deleted, Some(n + 1), "the network and its ports: {row:?}");
    assert_eq!(row.scenario, "p1");
    assert_eq!(row.engine, engine.as_str());
    let kw = row.key_writes_per_deleted.expect("key writes per deleted");
    assert!(kw > 0.0, "{row:?}");
    assert!(row.wall_s.is_some_and(|w| w > 0.0), "{row:?}");
    assert!(row.delete_call_ms.is_some(), "{row:?}");

    let base = RowSpec {
        scenario: Scenario::Baseline,
        baseline_of: Some(WriteFigures {
            key_writes: row.key_writes.expect("key writes"),
            value_bytes: row.value_bytes.expect("value bytes"),
            batches: row.batches.expect("batches"),
        }),
        deleted: row.deleted,
        ..spec
    };
    let b = crate::baseline::run(&base).expect("baseline runs");
    assert_eq!(b.key_writes, row.key_writes, "{b:?}");
    assert!(b.wall_s.is_some(), "{b:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p1_smoke_memory() {
    smoke(Engine::Memory).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p1_smoke_sled() {
    smoke(Engine::Sled).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p1_smoke_fjall() {
    smoke(Engine::Fjall).await;
}

#[test]
fn percentiles_are_nearest_rank() {
    let samples: Vec<f64> = (1..=100).map(f64::from).collect();
    assert_eq!(crate::harness::percentile(&samples, 0.5), Some(50.0));
    assert_eq!(crate::harness::percentile(&samples, 0.99), Some(99.0));
    assert_eq!(crate::harness::percentile(&samples, 1.0), Some(100.0));
    assert_eq!(crate::harness::percentile(&[], 0.5), None);
}
