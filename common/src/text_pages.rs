//! A program's own code and constants: what only its start used is let go once it serves.
//!
//! Start-up runs code the steady work does not (crius: the command line, the configuration and
//! CDI files, the database check, recovery, the runtime handlers' probes, the streaming
//! server's certificate; the shim: its daemonizing and first container), and the kernel maps
//! the neighbours of every page it faults in (fault-around), so after start most of the binary
//! is mapped: 9.2 of crius's 10 MB of text. Mapped pages count in the process's RSS, and mapped
//! executable ones are the last the kernel reclaims. Once, a little while into serving, the
//! process drops the page table entries of its read-only mappings (`MADV_DONTNEED`): what it
//! uses comes back on first use as minor faults from the page cache (no disk read), the rest
//! stays in the page cache as ordinary, reclaimable file pages.
//!
//! Only a read-only mapping of the executable holding no anonymous (copy-on-write) page is
//! touched, so not the relocated `.data.rel.ro`: dropping such a page's entry loses nothing,
//! as the next access maps the same file page again.

use std::path::Path;

/// A mapping of `/proc/self/smaps`: its address range, permissions and file.
struct Mapping<'a> {
    start: usize,
    end: usize,
    perms: &'a str,
    path: &'a str,
}

/// The mapping a header line of `/proc/self/smaps` describes ("start-end perms offset dev
/// inode path"), or `None` for a field line.
fn mapping(line: &str) -> Option<Mapping<'_>> {
    let mut fields = line.splitn(6, ' ');
    let (start, end) = fields.next()?.split_once('-')?;
    let start = usize::from_str_radix(start, 16).ok()?;
    let end = usize::from_str_radix(end, 16).ok()?;
    let perms = fields.next()?;
    // offset, device, inode
    for _ in 0..3 {
        fields.next()?;
    }
    let path = fields.next().unwrap_or("").trim_start();
    Some(Mapping {
        start,
        end,
        perms,
        path,
    })
}

/// The ranges of `smaps` that are read-only mappings of `exe` holding no anonymous page.
fn clean_read_only_ranges(smaps: &str, exe: &Path) -> Vec<(usize, usize)> {
    let exe = exe.to_string_lossy();
    let mut ranges = Vec::new();
    let mut text = None;
    for line in smaps.lines() {
        if let Some(m) = mapping(line) {
            let read_only = m.perms == "r-xp" || m.perms == "r--p";
            text = (read_only && m.path == exe).then_some((m.start, m.end));
            continue;
        }
        if let (Some(range), Some(anon)) = (text, line.strip_prefix("Anonymous:")) {
            if anon.trim() == "0 kB" {
                ranges.push(range);
            }
            text = None;
        }
    }
    ranges
}

/// How long after crius starts serving it releases the start-up pages: the tasks `start` spawns
/// and the server's set-up run after the socket is claimed, and their code would otherwise stay
/// mapped (measured: 6 to 8 MB of text mapped when the first call is answered). It then also
/// waits for a moment without a running call, for a minute at most: a call under way would
/// fault all its code back in at once.
pub const RELEASE_AFTER: std::time::Duration = std::time::Duration::from_secs(5);

/// Drops the page table entries of the executable's read-only mappings. Returns the bytes
/// of address space covered.
pub fn release() -> std::io::Result<usize> {
    let exe = std::fs::read_link("/proc/self/exe")?;
    let smaps = std::fs::read_to_string("/proc/self/smaps")?;
    let mut released = 0;
    for (start, end) in clean_read_only_ranges(&smaps, &exe) {
        // SAFETY: the range is a whole read-only mapping of the executable's file without a
        // private copy of any page: MADV_DONTNEED only unmaps its pages, and every
        // later access (this very code's included) faults the same file page back in.
        let done =
            unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_DONTNEED) };
        if done != 0 {
            return Err(std::io::Error::last_os_error());
        }
        released += end - start;
    }
    Ok(released)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMAPS: &str = "\
55d0a0000000-55d0a0300000 r--p 00000000 fe:00 123 /usr/bin/crius
Rss:                1900 kB
Anonymous:             0 kB
55d0a0300000-55d0a0d00000 r-xp 00300000 fe:00 123 /usr/bin/crius
Rss:                9100 kB
Anonymous:             0 kB
55d0a0d00000-55d0a0d70000 r--p 00d00000 fe:00 123 /usr/bin/crius
Rss:                 436 kB
Anonymous:           436 kB
7f0000000000-7f0000100000 r-xp 00000000 fe:00 456 /usr/lib/other lib.so
Rss:                 100 kB
Anonymous:             0 kB
7f0000200000-7f0000201000 r-xp 00000000 00:00 0 
Anonymous:             4 kB
";

    #[test]
    fn only_the_executables_clean_read_only_mappings_are_chosen() {
        let ranges = clean_read_only_ranges(SMAPS, Path::new("/usr/bin/crius"));
        assert_eq!(
            ranges,
            vec![
                (0x55d0a0000000, 0x55d0a0300000),
                (0x55d0a0300000, 0x55d0a0d00000)
            ]
        );
        // A path with a space is matched whole.
        let ranges = clean_read_only_ranges(SMAPS, Path::new("/usr/lib/other lib.so"));
        assert_eq!(ranges, vec![(0x7f0000000000, 0x7f0000100000)]);
    }

    #[test]
    fn a_mapping_with_a_private_page_is_left_alone() {
        let smaps = SMAPS.replace(
            "Rss:                9100 kB\nAnonymous:             0 kB",
            "Rss:                9100 kB\nAnonymous:             4 kB",
        );
        let ranges = clean_read_only_ranges(&smaps, Path::new("/usr/bin/crius"));
        assert_eq!(ranges, vec![(0x55d0a0000000, 0x55d0a0300000)]);
    }

    #[test]
    fn the_test_binary_keeps_running_after_its_text_is_released() {
        let released = release().expect("madvise");
        assert!(
            released > 0,
            "no read-only mapping of the test binary found"
        );
        // Code and constants still work: the pages fault back in.
        let v: Vec<u64> = (1..=1000).collect();
        assert_eq!(v.iter().sum::<u64>(), 500_500);
    }
}
