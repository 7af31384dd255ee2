//! The real-world inputs the tests read live in the repository (`tests/fixtures/real/`), copied
//! from the project's fixture channel (byte for byte but for `PROVENANCE.md`, see its README). `SHA256SUMS` records each file's SHA-256; this
//! test fails when a file is edited, removed or added without updating that list, so a fixture
//! cannot drift silently from the provenance its README gives.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn real() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/real")
}

fn files_under(dir: &Path, root: &Path, out: &mut BTreeSet<String>) {
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.expect("directory entry").path();
        if path.is_dir() {
            files_under(&path, root, out);
        } else {
            let rel = path.strip_prefix(root).expect("under root");
            out.insert(rel.to_string_lossy().replace('\\', "/"));
        }
    }
}

#[test]
fn every_real_fixture_matches_its_recorded_sha256() {
    let root = real();
    let sums = std::fs::read_to_string(root.join("SHA256SUMS"))
        .expect("tests/fixtures/real/SHA256SUMS (the list of the copied fixtures)");
    let mut listed = BTreeSet::new();
    for (i, line) in sums.lines().enumerate() {
        let (hash, name) = line
            .split_once("  ")
            .unwrap_or_else(|| panic!("SHA256SUMS line {}: not `HASH  PATH`", i + 1));
        let bytes = std::fs::read(root.join(name)).unwrap_or_else(|e| {
            panic!(
                "tests/fixtures/real/{name} (SHA256SUMS line {}): {e}",
                i + 1
            )
        });
        assert_eq!(
            rigbench::gpu::kernel_cache::sha256_hex(&bytes),
            hash,
            "tests/fixtures/real/{name} differs from the copy SHA256SUMS records"
        );
        listed.insert(name.to_string());
    }
    let mut present = BTreeSet::new();
    files_under(&root, &root, &mut present);
    present.remove("SHA256SUMS");
    present.remove("README.md");
    let unlisted: Vec<_> = present.difference(&listed).collect();
    assert!(
        unlisted.is_empty(),
        "files in tests/fixtures/real/ that SHA256SUMS does not list (add them with their provenance): {unlisted:?}"
    );
    assert!(listed.len() >= 70, "only {} fixtures listed", listed.len());
}
