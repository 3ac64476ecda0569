//! Reading a disk layer's directory as Envoy's `DiskLayer` walks it: every regular file under
//! it (symlinks followed, hidden names included) is a key named by
//! [`disk_key`](crate::config::runtime::disk_key), its text kept as
//! [`disk_text`](crate::config::runtime::disk_text) keeps it; any failure fails the layer.

use std::collections::HashMap;
use std::path::Path;

use crate::config::runtime::{RuntimeValue, disk_key, disk_text};

/// How deep Envoy walks a layer's directories (the layer's own directory is depth 1).
const MAX_WALK_DEPTH: usize = 16;

/// The values of the layer whose directory is `dir`, or why the layer cannot be read.
pub(super) fn read_layer(dir: &Path) -> Result<HashMap<String, RuntimeValue>, String> {
    let mut values = HashMap::new();
    walk(dir, &mut Vec::new(), &mut values)?;
    Ok(values)
}

/// Adds the files under `dir` (at `prefix`, the names of the directories above it) to `values`.
fn walk(
    dir: &Path,
    prefix: &mut Vec<String>,
    values: &mut HashMap<String, RuntimeValue>,
) -> Result<(), String> {
    if prefix.len() >= MAX_WALK_DEPTH {
        return Err(format!("Walk recursion depth exceeded {MAX_WALK_DEPTH}"));
    }
    if illegal(dir) {
        return Err(format!("Invalid path: {}", dir.display()));
    }
    let entries = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for entry in entries {
        let entry = entry.map_err(|e| format!("{}: {e}", dir.display()))?;
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        prefix.push(name);
        match file_type(&path)? {
            Kind::Directory => walk(&path, prefix, values)?,
            Kind::Regular => {
                let bytes = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
                let text = disk_text(&String::from_utf8_lossy(&bytes));
                let key = disk_key(prefix.iter().map(String::as_str));
                values.insert(key, RuntimeValue::from_disk(text)?);
            }
            Kind::Other => {}
        }
        prefix.pop();
    }
    Ok(())
}

/// What a directory entry is, its symlinks followed.
enum Kind {
    Directory,
    Regular,
    Other,
}

/// Envoy's `fileType`: a dangling symlink is a regular file (whose read then fails).
fn file_type(path: &Path) -> Result<Kind, String> {
    match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => Ok(Kind::Directory),
        Ok(m) if m.is_file() => Ok(Kind::Regular),
        Ok(_) => Ok(Kind::Other),
        Err(e)
            if e.kind() == std::io::ErrorKind::NotFound
                && std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink()) =>
        {
            Ok(Kind::Regular)
        }
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

/// Envoy's `illegalPath`: a path that does not resolve, or resolves under `/dev`, `/sys` or
/// `/proc`.
fn illegal(path: &Path) -> bool {
    match std::fs::canonicalize(path) {
        Ok(real) => ["/dev", "/sys", "/proc"]
            .iter()
            .any(|p| real.to_string_lossy().starts_with(p)),
        Err(_) => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_become_keys_and_failures_fail_the_layer() {
        let root = std::env::temp_dir().join(format!("revoy-disk-layer-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("a/.b")).unwrap();
        std::fs::write(root.join("a/.b/c"), "# note\n 7 \n").unwrap();
        std::fs::write(root.join("top"), "numerator: 5\ndenominator: MILLION\n").unwrap();
        let values = read_layer(&root).unwrap();
        assert_eq!(values["a..b.c"].raw, " 7");
        assert_eq!(values["a..b.c"].uint, Some(7));
        assert_eq!(
            values["top"].fraction.map(|f| f.denominator),
            Some(1_000_000)
        );
        std::os::unix::fs::symlink(root.join("nowhere"), root.join("dangling")).unwrap();
        assert!(read_layer(&root).is_err());
        std::fs::remove_file(root.join("dangling")).unwrap();
        std::os::unix::fs::symlink(&root, root.join("a/loop")).unwrap();
        assert_eq!(
            read_layer(&root).unwrap_err(),
            "Walk recursion depth exceeded 16"
        );
        std::fs::remove_dir_all(&root).unwrap();
    }
}
