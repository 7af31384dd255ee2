//! The board as an SQLite file (rusqlite, SQLite compiled in): the same rows as the Markdown and
//! CSV, and the reports, conditions and skipped files beside them, for queries across many
//! boards' worth of reports.
//!
//! Tables:
//! - `reports(path, rig_label, gpu, gpus, driver, rigbench_version, schema_version, created_utc,
//!   complete, on_board, notes)`;
//! - `conditions(tag, kind, text)`: `kind` is `kernels` or `e2e`;
//! - `board(id, report, format, composite_m1_s, composite_m16_s, composite_m64_s,
//!   kernel_conditions, rank, e2e_conditions, kv_capacity_tokens, kv_capacity_source,
//!   checkpoint, notes)`: seconds per decode step, `NULL` where not measured;
//! - `e2e_points(board_id, label, output_tok_per_s, slo_attainment, j_per_output_token)`: one
//!   line per valid sweep point (`NULL` where no SLO was set or no energy was measured);
//! - `skipped(path, reason)`.

use std::path::Path;

use rusqlite::{params, Connection};

use super::Board;

/// Write `board` to a new SQLite file at `path` (built beside it, then moved over any earlier
/// one, so a failure leaves the earlier file as it was).
///
/// # Errors
/// The file cannot be created or written; the message names it.
pub fn write(board: &Board, path: &Path) -> anyhow::Result<()> {
    let tmp = path.with_extension("sqlite.tmp");
    let _ = std::fs::remove_file(&tmp);
    let res = fill(board, &tmp);
    if let Err(e) = res {
        let _ = std::fs::remove_file(&tmp);
        return Err(e.context(format!("cannot write {}", path.display())));
    }
    std::fs::rename(&tmp, path).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        anyhow::anyhow!("cannot write {}: {e}", path.display())
    })
}

fn fill(board: &Board, path: &Path) -> anyhow::Result<()> {
    let mut db = Connection::open(path)?;
    db.execute_batch(
        "CREATE TABLE reports (path TEXT PRIMARY KEY, rig_label TEXT NOT NULL, gpu TEXT NOT NULL,
             gpus INTEGER NOT NULL, driver TEXT, rigbench_version TEXT NOT NULL,
             schema_version INTEGER NOT NULL, created_utc TEXT NOT NULL, complete INTEGER NOT NULL,
             on_board INTEGER NOT NULL, notes TEXT NOT NULL);
         CREATE TABLE conditions (tag TEXT PRIMARY KEY, kind TEXT NOT NULL, text TEXT NOT NULL);
         CREATE TABLE board (id INTEGER PRIMARY KEY, report TEXT NOT NULL REFERENCES reports(path),
             format TEXT NOT NULL, composite_m1_s REAL, composite_m16_s REAL,
             composite_m64_s REAL, kernel_conditions TEXT REFERENCES conditions(tag),
             rank INTEGER, e2e_conditions TEXT REFERENCES conditions(tag),
             kv_capacity_tokens INTEGER, kv_capacity_source TEXT, checkpoint TEXT,
             notes TEXT NOT NULL);
         CREATE TABLE e2e_points (board_id INTEGER NOT NULL REFERENCES board(id),
             label TEXT NOT NULL, output_tok_per_s REAL NOT NULL,
             slo_attainment REAL, j_per_output_token REAL);
         CREATE TABLE skipped (path TEXT NOT NULL, reason TEXT NOT NULL);",
    )?;
    let tx = db.transaction()?;
    for r in &board.reports {
        tx.execute(
            "INSERT INTO reports VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
            params![
                r.path,
                r.rig_label,
                r.gpu,
                r.gpus as i64,
                r.driver,
                r.rigbench_version,
                i64::from(r.schema_version),
                r.created_utc,
                r.complete,
                r.on_board,
                r.notes.join("; "),
            ],
        )?;
    }
    for (kind, list) in [
        ("kernels", &board.kernel_conditions),
        ("e2e", &board.e2e_conditions),
    ] {
        for c in list {
            tx.execute(
                "INSERT INTO conditions VALUES (?1, ?2, ?3)",
                params![c.tag, kind, c.text],
            )?;
        }
    }
    for (i, row) in board.rows.iter().enumerate() {
        let id = i as i64 + 1;
        tx.execute(
            "INSERT INTO board VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)",
            params![
                id,
                board.reports[row.report].path,
                row.format,
                row.composite_s[0],
                row.composite_s[1],
                row.composite_s[2],
                row.kernels,
                row.rank.map(|n| n as i64),
                row.e2e_conditions,
                row.kv_capacity
                    .as_ref()
                    .map(|k| i64::try_from(k.0).unwrap_or(i64::MAX)),
                row.kv_capacity.as_ref().map(|k| k.1.clone()),
                row.checkpoint,
                row.notes.join("; "),
            ],
        )?;
        for p in &row.e2e {
            tx.execute(
                "INSERT INTO e2e_points VALUES (?1, ?2, ?3, ?4, ?5)",
                params![id, p.label, p.tok_per_s, p.goodput, p.j_per_output_token],
            )?;
        }
    }
    for (p, why) in &board.skipped {
        tx.execute("INSERT INTO skipped VALUES (?1, ?2)", params![p, why])?;
    }
    tx.commit()?;
    Ok(())
}
