//! Task runs: "backup" (pg_basebackup of the primary, plain format, into a
//! `file:` location) and "repair" (VACUUM (ANALYZE) of every database and
//! amcheck of every btree index). A run is a future the caller races
//! against its stop signal: dropping it kills the child it runs.

use crate::ops::unavailable;
use crate::pg;
use crate::store::ClusterRecord;
use crate::Inner;
use drover_proto::v1 as api;
use std::path::PathBuf;
use tonic::Status;

/// The directory a backup location names: `[dc:]file:/abs/dir`.
pub fn backup_dir(spec: Option<&api::TaskSpec>) -> Result<PathBuf, Status> {
    let field = "spec.backup.location";
    let Some(api::task_spec::Properties::Backup(props)) = spec.and_then(|s| s.properties.as_ref())
    else {
        return Err(Status::invalid_argument(format!(
            "{field}: a backup needs a location"
        )));
    };
    let location = props
        .location
        .first()
        .ok_or_else(|| Status::invalid_argument(format!("{field}: a backup needs a location")))?;
    let path = match location.split_once(':') {
        Some(("file", rest)) => Some(rest),
        Some((_dc, rest)) => rest.strip_prefix("file:"),
        None => None,
    };
    match path {
        Some(p) if p.starts_with('/') => Ok(PathBuf::from(p)),
        _ => Err(Status::invalid_argument(format!(
            "{field}: {location:?} is not [dc:]file:/absolute/dir, the only kind this provider writes"
        ))),
    }
}

/// Copies the primary into `<dir>/<cluster uid>/<run id>`, restorable by
/// starting postgres on a copy of it.
pub async fn backup(
    inner: &Inner,
    cluster: &ClusterRecord,
    dir: PathBuf,
    run_id: &str,
) -> Result<String, Status> {
    let primary = cluster
        .primary()
        .ok_or_else(|| Status::failed_precondition("no primary"))?;
    let bin = inner
        .cfg
        .versions
        .get(&primary.version)
        .ok_or_else(|| Status::failed_precondition("version not configured"))?;
    let parent = dir.join(&cluster.uid);
    inner.pg.make_dir(&dir).map_err(unavailable)?;
    inner.pg.make_dir(&parent).map_err(unavailable)?;
    let target = parent.join(run_id);
    // A run cut short by a provider restart may have left part of a copy.
    crate::ops::remove_dir(&target)?;
    inner
        .pg
        .basebackup(bin, primary.port, &target, None)
        .await
        .map_err(unavailable)?;
    let mib = pg::dir_size(&target) as f64 / (1024.0 * 1024.0);
    Ok(format!(
        "backup of {mib:.1} MiB in file:{}",
        target.display()
    ))
}

/// VACUUM (ANALYZE) of every database that takes connections, then amcheck
/// of their btree indexes where the extension is installed.
pub async fn repair(inner: &Inner, cluster: &ClusterRecord) -> Result<String, Status> {
    let primary = cluster
        .primary()
        .ok_or_else(|| Status::failed_precondition("no primary"))?;
    let bin = inner
        .cfg
        .versions
        .get(&primary.version)
        .ok_or_else(|| Status::failed_precondition("version not configured"))?;
    let q = |db: String, sql: &'static str| async move {
        inner
            .pg
            .query(bin, primary.port, &db, sql)
            .await
            .map_err(unavailable)
    };
    let dbs = q(
        "postgres".into(),
        "SELECT datname FROM pg_database WHERE datallowconn ORDER BY 1",
    )
    .await?;
    let (mut checked, mut without_amcheck) = (0, Vec::new());
    for db in dbs.lines().map(str::to_string) {
        q(db.clone(), "VACUUM (ANALYZE)").await?;
        if q(db.clone(), "CREATE EXTENSION IF NOT EXISTS amcheck")
            .await
            .is_err()
        {
            without_amcheck.push(db);
            continue;
        }
        // bt_index_check raises an error on corruption, which ends the run.
        let sql = "SELECT bt_index_check(c.oid), c.relname FROM pg_index i \
                   JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_am a ON a.oid = c.relam \
                   WHERE a.amname = 'btree' AND i.indisvalid AND i.indisready \
                   AND c.relpersistence <> 't'";
        checked += q(db, sql).await?.lines().count();
    }
    let mut report = format!(
        "{} databases vacuumed and analyzed; {checked} btree indexes checked by amcheck, no corruption",
        dbs.lines().count()
    );
    if !without_amcheck.is_empty() {
        report.push_str(&format!("; amcheck unavailable in {without_amcheck:?}"));
    }
    Ok(report)
}
