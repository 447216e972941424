//! The watch feeder, on one kind started through its seam under a paused clock: what reaches
//! an actor and what does not.

use std::time::Duration;

use super::testing::{PassLog, logging, start_kind, test_policy};

#[tokio::test(start_paused = true)]
async fn the_echoes_of_the_runtimes_own_writes_run_no_pass() {
    let log = PassLog::default();
    let kind = start_kind(logging(log.clone()), test_policy()).await;
    kind.create("a").await;
    kind.wait_ready("a").await;
    // The finalizer and the status were written, and their watch events delivered; under the
    // paused clock this sleep ends only once every task is idle.
    tokio::time::sleep(Duration::from_secs(3600)).await;
    assert_eq!(log.count("a"), 1, "one pass for one generation");
    // A change of the user's is news.
    kind.set_note("a", "changed").await;
    tokio::time::sleep(Duration::from_secs(3600)).await;
    assert_eq!(log.count("a"), 2);
    kind.stop().await;
}

#[tokio::test(start_paused = true)]
async fn an_object_deleted_and_created_again_under_its_name_is_run_afresh() {
    let log = PassLog::default();
    let kind = start_kind(logging(log.clone()), test_policy()).await;
    kind.create("a").await;
    kind.wait_ready("a").await;
    kind.delete("a").await;
    kind.wait_gone("a").await;
    kind.create("a").await;
    kind.wait_ready("a").await;
    assert_eq!(log.count("a"), 2, "the new object's first pass");
    log.assert_no_overlap("a");
    kind.stop().await;
}
