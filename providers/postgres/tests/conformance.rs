//! The provider conformance kit (drover-provider-check) against the
//! PostgreSQL provider: every check of the contract passes on real
//! PostgreSQL, as it does on the simulator.

mod common;

use common::Env;
use drover_provider_check::{run, Config, Verdict};
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_postgres_provider_passes_the_conformance_kit() {
    let env = Env::new("kit").await;
    let config = Config {
        provider: env.endpoint.clone(),
        ca_cert: None,
        token_file: None,
        only: Vec::new(),
        // Creating a primary and its standbys takes seconds, not
        // milliseconds.
        call_timeout: Duration::from_secs(120),
        simulator: false,
    };
    let reports = run(&config, |report| println!("{report}"))
        .await
        .expect("the kit runs");
    let failed: Vec<String> = reports
        .iter()
        .filter(|r| r.failed())
        .map(ToString::to_string)
        .collect();
    assert!(failed.is_empty(), "{failed:#?}");
    let passed = reports
        .iter()
        .filter(|r| matches!(r.verdict, Verdict::Pass(_)))
        .count();
    assert!(passed >= 15, "{passed} of {} passed", reports.len());
}
