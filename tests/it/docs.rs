//! The README as a new user reads it: every repository path it names exists, it says which Rust
//! it requires (the same as Cargo.toml's rust-version), and it shows how to call the binary.

use std::path::Path;

fn readme() -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md"))
        .expect("README.md is readable")
}

#[test]
fn readme_names_only_files_that_exist() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let text = readme();
    let tops = [
        "src/",
        "docs/",
        "suites/",
        "baselines/",
        "reports/",
        "tests/",
        "scripts/",
        "kernels/",
        ".ci/",
    ];
    let mut checked = 0;
    for (i, chunk) in text.split('`').enumerate() {
        // Odd chunks are inside backticks; a fenced block is split the same way, so look at
        // every word of the chunk that starts like a repository path.
        if i % 2 == 0 {
            continue;
        }
        for word in chunk.split_whitespace() {
            let word = word.trim_end_matches([',', '.', ';', ')']);
            if !tops.iter().any(|t| word.starts_with(t)) || word.contains('<') {
                continue;
            }
            let exists = match word.split_once('*') {
                // `kernels/*.cu`: some file of that folder matches.
                Some((dir, suffix)) => std::fs::read_dir(root.join(dir))
                    .map(|rd| {
                        rd.filter_map(|e| e.ok())
                            .any(|e| e.file_name().to_string_lossy().ends_with(suffix))
                    })
                    .unwrap_or(false),
                None => root.join(word).exists(),
            };
            assert!(
                exists,
                "README.md names {word}, which is not in the repository"
            );
            checked += 1;
        }
    }
    assert!(
        checked >= 5,
        "only {checked} paths found: the scan is broken"
    );
}

#[test]
fn readme_says_what_rust_it_requires_and_how_to_call_the_binary() {
    let text = readme();
    let cargo =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml")).unwrap();
    let rv = cargo
        .lines()
        .find_map(|l| l.strip_prefix("rust-version = \""))
        .and_then(|l| l.strip_suffix('"'))
        .expect("Cargo.toml has a rust-version");
    assert!(
        text.contains(&format!("Requires Rust {rv} or newer")),
        "README must say it requires Rust {rv}"
    );
    assert!(
        text.contains("target/release/rigbench")
            && text.contains("cargo install --locked --path .")
    );
}

/// The README's two set-up commands build the dependencies once (both in the release profile),
/// and `.ci/run` runs the README's test command.
#[test]
fn the_readme_set_up_commands_share_one_profile_and_ci_runs_the_test_command() {
    let text = readme();
    let block = text
        .split("```sh\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("the README opens with a sh block of its set-up commands");
    let cmds: Vec<&str> = block
        .lines()
        .map(|l| l.split('#').next().unwrap_or("").trim())
        .filter(|l| l.starts_with("cargo ") || l.contains("&& cargo "))
        .collect();
    assert_eq!(cmds.len(), 2, "{cmds:?}");
    assert!(
        cmds.iter().all(|c| c.contains("--release")),
        "both in the release profile, or the dependencies are built twice: {cmds:?}"
    );
    assert!(
        cmds.iter().all(|c| c.contains("--locked")),
        "both with --locked, so that they build the versions of Cargo.lock: {cmds:?}"
    );
    let test = cmds
        .iter()
        .find(|c| c.contains("cargo test"))
        .expect("a test command");
    let ci = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(".ci/run"))
        .expect(".ci/run");
    assert!(
        ci.lines().any(|l| l.trim() == *test),
        ".ci/run does not run the README's test command `{test}`"
    );
}
