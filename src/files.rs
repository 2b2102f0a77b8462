//! Reading the files a config names (the config itself, the rate-limit service's rules,
//! consumers, keys, tokens, certificates): regular files only, and at most [`MAX_FILE_BYTES`].
//!
//! A config directory is a place where a mistake (or an attacker with a foothold) can leave a
//! link to `/dev/zero`, a FIFO or a multi-gigabyte file; read whole, any of them stalls or kills
//! the process that parses it, and on SIGHUP that is a running floodgate. So a file is looked
//! at before it is opened (what the path names, links followed, must be a regular file), looked
//! at again once open (the same question of what was opened), and read no further than the limit.

use std::io::Read;
use std::path::Path;

/// The most any file a config names may hold: configs, rules and keys are kilobytes.
pub const MAX_FILE_BYTES: u64 = 16 << 20;

/// The bytes of `path`, or a sentence naming it and saying what is wrong.
pub fn read(path: &Path) -> Result<Vec<u8>, String> {
    read_at_most(path, MAX_FILE_BYTES)
}

/// The text of `path` (UTF-8), or a sentence naming it and saying what is wrong.
pub fn read_text(path: &Path) -> Result<String, String> {
    String::from_utf8(read(path)?).map_err(|_| format!("{} is not UTF-8 text", path.display()))
}

/// The bytes of `path` if it is a regular file of at most `max` bytes.
pub fn read_at_most(path: &Path, max: u64) -> Result<Vec<u8>, String> {
    let cannot = |e: std::io::Error| format!("cannot read {}: {e}", path.display());
    let meta = std::fs::metadata(path).map_err(cannot)?;
    check(path, &meta, max)?;
    let file = std::fs::File::open(path).map_err(cannot)?;
    // What was opened may not be what was looked at (the path changed in between).
    check(path, &file.metadata().map_err(cannot)?, max)?;
    let mut bytes = Vec::with_capacity(meta.len().min(max) as usize);
    file.take(max + 1).read_to_end(&mut bytes).map_err(cannot)?;
    if bytes.len() as u64 > max {
        return Err(too_large(path, max));
    }
    Ok(bytes)
}

fn check(path: &Path, meta: &std::fs::Metadata, max: u64) -> Result<(), String> {
    if !meta.is_file() {
        let kind = if meta.is_dir() {
            "a directory"
        } else {
            "not a regular file (a device, a FIFO or a socket)"
        };
        return Err(format!(
            "{} is {kind}; only regular files are read",
            path.display()
        ));
    }
    if meta.len() > max {
        return Err(too_large(path, max));
    }
    Ok(())
}

fn too_large(path: &Path, max: u64) -> String {
    format!(
        "{} is larger than {max} bytes, the most floodgate reads",
        path.display()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_device_a_fifo_and_a_directory_are_refused_by_name() {
        let dir = std::env::temp_dir().join(format!("floodgate-files-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let zero = dir.join("zero.yaml");
        let _ = std::fs::remove_file(&zero);
        std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
        let err = read(&zero).unwrap_err();
        assert!(
            err.contains("zero.yaml") && err.contains("not a regular file"),
            "{err}"
        );
        let fifo = dir.join("fifo.yaml");
        let _ = std::fs::remove_file(&fifo);
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(made.success());
        let err = read(&fifo).unwrap_err();
        assert!(
            err.contains("fifo.yaml") && err.contains("not a regular file"),
            "{err}"
        );
        let err = read(&dir).unwrap_err();
        assert!(err.contains("a directory"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_file_over_the_limit_is_refused_and_one_within_it_is_read() {
        let dir = std::env::temp_dir().join(format!("floodgate-files-big-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("big.yaml");
        std::fs::write(&path, vec![b'a'; 100]).unwrap();
        assert_eq!(read_at_most(&path, 100).unwrap().len(), 100);
        let err = read_at_most(&path, 99).unwrap_err();
        assert!(err.contains("larger than 99 bytes"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
