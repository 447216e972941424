//! The rounds of a chaos run: each creates, changes and deletes items while the operator is
//! killed, paused and its control plane restarted (see the module docs of `chaos`).

use super::setup::set_up;
use super::*;

/// The items of round `round`: `(name, uses)`.
pub(super) fn round_items(round: u32, n: usize) -> Vec<(String, Option<String>)> {
    let name = |i: usize| format!("r{round}-i{i}");
    (0..n)
        .map(|i| {
            let uses = (i % 3 != 0).then(|| name(i - i % 3));
            (name(i), uses)
        })
        .collect()
}

/// The items of a round to delete: the standalone items with an even index (and every item
/// using them), and the users of the others with an odd index.
fn to_delete(items: &[(String, Option<String>)]) -> HashSet<String> {
    let base = |i: usize| (i - i % 3) / 3;
    items
        .iter()
        .enumerate()
        .filter(|(i, _)| base(*i) % 2 == 0 || (i % 3 != 0 && i % 2 == 1))
        .map(|(_, (n, _))| n.clone())
        .collect()
}

/// Rounds of faults until `--duration` has passed (one round without it), then the clean-up
/// and the checks of every record.
pub(super) async fn drive(
    args: &ChaosArgs,
    env: &mut Envtest,
    records: &std::path::Path,
) -> Result<Report> {
    let planted = set_up(env, args, records).await?;
    let admin = env.client();
    let items: Api<ChaosItem> = Api::namespaced(admin.clone(), NAMESPACE);
    let watch = order::Watch::start(items.clone());
    let mut procs = Procs::default();
    for _ in 0..args.replicas {
        let operator = procs.start(env, args, records)?;
        procs.operators.push(operator);
    }
    let hand_overs = (args.replicas > 1).then(|| {
        let (namespace, prefix) = operator::SHARD_LEASES;
        let skew = args.clock_skew;
        shards::ShardWatch::start(admin.clone(), namespace, prefix, move |holder| {
            process::skew_of_holder(holder, skew)
        })
    });
    // When kube-apiserver or etcd was down, and which replica was frozen when (wall-clock
    // microseconds).
    let mut outages = Vec::new();
    let mut pauses = Vec::new();
    let mut report = Report {
        seed: args.seed,
        replicas: args.replicas,
        ..Default::default()
    };
    report.faults.clock_skew_seconds = args.clock_skew;
    let mut statuses = String::new();
    let deadline = args.duration.map(|d| Instant::now() + d);
    let mut round = 0;
    loop {
        let all = round_items(round, args.objects);
        report.objects += all.len();

        // Provision, through a kill -9 of the operator, a kube-apiserver and an etcd restart.
        let since = lines::wall_micros();
        let phase = Instant::now();
        for (name, uses) in &all {
            let item = ChaosItem::new(
                name,
                ChaosItemSpec {
                    uses: uses.clone(),
                    revision: 0,
                },
            );
            create(&items, &item, "creating an item").await?;
        }
        reconciles_started(records, since, "provision", all.len() / 3, KILL_WAIT).await?;
        let victim = round as usize % procs.operators.len();
        procs.kill_and_restart(victim, env, args, records)?;
        if procs.operators.len() > 1 {
            // Another replica stands still past its Leases, then goes on: its shards have moved.
            let paused = &procs.operators[(victim + 1) % procs.operators.len()];
            let from = lines::wall_micros();
            paused.pause(PAUSE).await;
            pauses.push((paused.incarnation(), from, lines::wall_micros()));
            report.faults.replicas_paused += 1;
        }
        tokio::time::sleep(Duration::from_millis(1500)).await;
        restart(env, Component::Apiserver, &mut outages).await?;
        report.faults.apiserver_restarts += 1;
        tokio::time::sleep(Duration::from_millis(1500)).await;
        restart(env, Component::Etcd, &mut outages).await?;
        report.faults.etcd_restarts += 1;
        let names: Vec<&str> = all.iter().map(|(n, _)| n.as_str()).collect();
        converge(&items, &names, &mut report.violations, &mut statuses).await?;
        report
            .phases
            .push(("provision".into(), phase.elapsed().as_secs_f64()));

        // A new generation for every fourth item.
        let phase = Instant::now();
        let bumped: Vec<&str> = names.iter().copied().step_by(4).collect();
        for name in &bumped {
            let patch = Patch::Merge(serde_json::json!({ "spec": { "revision": 1 } }));
            idempotent("changing an item", None, || async {
                items
                    .patch(name, &PatchParams::default(), &patch)
                    .await
                    .map(drop)
            })
            .await?;
        }
        converge(&items, &names, &mut report.violations, &mut statuses).await?;
        report
            .phases
            .push(("update".into(), phase.elapsed().as_secs_f64()));

        // Deprovision half, through a kill -9 and a kube-apiserver restart.
        let doomed = to_delete(&all);
        let since = lines::wall_micros();
        let phase = Instant::now();
        report.deleted += doomed.len();
        for name in &doomed {
            delete(&items, name).await?;
        }
        reconciles_started(records, since, "deprovision", doomed.len() / 3, KILL_WAIT).await?;
        let victim = (round as usize + 1) % procs.operators.len();
        // With replicas, kube-apiserver restarts below while the victim's shards move.
        procs.kill_and_restart(victim, env, args, records)?;
        tokio::time::sleep(Duration::from_millis(1000)).await;
        restart(env, Component::Apiserver, &mut outages).await?;
        report.faults.apiserver_restarts += 1;
        let kept: Vec<&str> = names
            .iter()
            .copied()
            .filter(|n| !doomed.contains(*n))
            .collect();
        wait_gone(&items, &doomed, &mut report.violations).await?;
        report
            .phases
            .push(("deprovision".into(), phase.elapsed().as_secs_f64()));
        converge(&items, &kept, &mut report.violations, &mut statuses).await?;
        check_children(&admin, &items, &mut report.violations).await?;

        round += 1;
        if deadline.is_none_or(|d| Instant::now() >= d) {
            break;
        }
    }
    report.rounds = round;
    report.faults.operator_kills = procs.killed.len() as u32;

    // Clean up: every item deleted and gone, then the operator stopped with SIGTERM.
    let left: Vec<String> = list(&items).await?.iter().map(|i| i.name_any()).collect();
    for name in &left {
        delete(&items, name).await?;
    }
    wait_gone(&items, &left.into_iter().collect(), &mut report.violations).await?;
    check_children(&admin, &items, &mut report.violations).await?;
    if let Some(watch) = hand_overs {
        let mut figures = watch.stop().await;
        figures.measure(&outages, operator::policy(false).lease.duration * 2);
        report.violations.unowned_shards = figures.too_slow;
        report.hand_overs = Some(figures);
    }
    for operator in std::mem::take(&mut procs.operators) {
        let (incarnation, clean) = operator.stop().await;
        procs.deaths.insert(incarnation, lines::wall_micros());
        if !clean {
            report.violations.unclean_shutdowns += 1;
        }
    }
    report.violations.deletion_order = watch.stop().await;

    check_records(
        records,
        Fates {
            deaths: &procs.deaths,
            killed: &procs.killed,
            pauses: &pauses,
        },
        &planted,
        &admin,
        &statuses,
        &mut report,
    )
    .await?;
    Ok(report)
}
