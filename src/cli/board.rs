//! `rigbench board DIR…`: one table of many rigs' reports (see `crate::board`).
//!
//! Prints the Markdown board on stdout; with `--out DIR` also writes `DIR/BOARD.md`,
//! `DIR/board.csv` and `DIR/board.sqlite` (each replaced whole). Exit codes: 0 the board was made;
//! 1 a folder cannot be read, no results file could be read, or an output cannot be written;
//! 64 a bad command line.

use std::path::PathBuf;

use crate::board::Board;
use crate::{ExitStatus, RigError};

/// Arguments of `rigbench board`.
#[derive(Debug, clap::Args)]
#[command(after_help = crate::cli::help::after_help(crate::cli::help::Cmd::Board))]
pub struct BoardArgs {
    /// Folders to read every results.json under (report folders, or folders of them such as
    /// reports/), or results.json files.
    #[arg(value_name = "DIR", required = true)]
    pub dirs: Vec<PathBuf>,
    /// Also write BOARD.md, board.csv and board.sqlite into this folder (created if missing;
    /// earlier boards there are replaced).
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
}

/// Run `rigbench board`.
///
/// # Errors
/// A folder cannot be read, none of the files found could be read as results, or an output
/// cannot be written.
pub fn run(args: BoardArgs) -> anyhow::Result<ExitStatus> {
    let board = Board::read(&args.dirs)?;
    for (p, why) in &board.skipped {
        eprintln!("rigbench board: skipped {p}: {why}");
    }
    if board.reports.is_empty() {
        return Err(RigError::file(
            args.dirs.first().cloned().unwrap_or_default(),
            format!(
                "no rigbench results.json could be read under {} ({} found and skipped)",
                board.roots.join(", "),
                board.skipped.len()
            ),
        )
        .into());
    }
    let md = board.markdown();
    if let Some(out) = &args.out {
        std::fs::create_dir_all(out)
            .map_err(|e| RigError::file(out, format!("cannot create the --out folder: {e}")))?;
        crate::output::write::atomic_write(&out.join("BOARD.md"), md.as_bytes())?;
        crate::output::write::atomic_write(&out.join("board.csv"), board.csv()?.as_bytes())?;
        crate::board::sqlite::write(&board, &out.join("board.sqlite"))?;
        eprintln!(
            "rigbench board: {} rows from {} reports; wrote {}, {} and {}",
            board.rows.len(),
            board.reports.len(),
            out.join("BOARD.md").display(),
            out.join("board.csv").display(),
            out.join("board.sqlite").display()
        );
    }
    print!("{md}");
    Ok(ExitStatus::Ok)
}
