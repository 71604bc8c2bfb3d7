//! Tuned winners on disk, per device model: one TSV file per kernel family under the cache
//! root (`<cache root>/<family>/<model>-<driver version>-<features>.tsv`, lines
//! `variant µs class`), loaded on first use and rewritten atomically (temporary file,
//! rename) when a winner is added. The matmul and attention tuners share it.
//!
//! `<model>` is the PCI vendor and device id, not the device's UUID: identical GPUs share
//! their winners. With one file per GPU, the second GPU of a data-parallel run explored for
//! hundreds of steps that the first had settled, and every rank waited for it in the
//! all-reduce (bench/results/2026-11-29-data-parallel-h200x2.md, session 40).
//!
//! `<features>` names the enabled features that decide which kernel families can run
//! (cooperative matrices per input type, workgroup-scope matrices, subgroup reductions):
//! the same device with some of them hidden (a validation layer that does not know an
//! extension, `HELIOS_NO_SUBGROUP`) tunes into a file of its own. Once, winners tuned with
//! cooperative matrices hidden were stored under the device's one key and later kept a
//! run with them available on 12× slower SIMT attention kernels.
//!
//! The one decision a reader must know: a line whose variant the current build does not know
//! is dropped on load, so a stale file can never force a kernel that no longer exists, and a
//! file whose header names another `version` of the family is ignored whole (a family bumps
//! its version when its kernels change enough that old timings mislead).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;

use crate::realize_lock::LockExt;
use crate::Device;

/// One family's winners for every device seen in this process.
pub(crate) struct TuningStore {
    family: &'static str,
    /// Written in the header; a file of another version is not read.
    version: u32,
    /// Whether the current build knows a variant tag.
    known: fn(&str) -> bool,
    /// Per device key: the file and its class → (variant, µs).
    devices: Mutex<Option<HashMap<String, Entries>>>,
}

struct Entries {
    /// `<family>/<device key>.tsv` under the cache root.
    path: Option<PathBuf>,
    winners: HashMap<String, (String, f64)>,
    /// Winners stored for this device under other drivers (newest file first wins): the
    /// first choices of a driver update, which tuning on real work then checks. Read on
    /// the first question: stores that never ask (tuning progress) never list the folder.
    earlier: Option<HashMap<String, String>>,
}

impl TuningStore {
    pub(crate) const fn new(
        family: &'static str,
        version: u32,
        known: fn(&str) -> bool,
    ) -> TuningStore {
        TuningStore {
            family,
            version,
            known,
            devices: Mutex::new(None),
        }
    }

    /// The winning variant tag for `class` on `device`, if one is stored.
    pub(crate) fn get(&self, device: &Device, class: &str) -> Option<String> {
        self.entry(device, class).map(|(v, _)| v)
    }

    /// The variant stored for `class` on `device` and its time, µs, if one is stored.
    pub(crate) fn entry(&self, device: &Device, class: &str) -> Option<(String, f64)> {
        self.with(device, |e| e.winners.get(class).cloned())
    }

    /// The winner stored for `class` on this device under another driver (or the same
    /// driver with other features), if any: a good first choice after a driver update.
    pub(crate) fn earlier(&self, device: &Device, class: &str) -> Option<String> {
        self.with(device, |e| {
            let earlier = e.earlier.get_or_insert_with(|| match &e.path {
                Some(path) => self.earlier_files(path),
                None => HashMap::new(),
            });
            earlier.get(class).cloned()
        })
    }

    /// Every winner for `device`: (class, variant, µs), sorted by class.
    pub(crate) fn all(&self, device: &Device) -> Vec<(String, String, f64)> {
        let mut v: Vec<_> = self.with(device, |e| {
            e.winners
                .iter()
                .map(|(c, (v, us))| (c.clone(), v.clone(), *us))
                .collect()
        });
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }

    /// Forgets `class`'s winner (and rewrites the file): tests that explore a class start
    /// from nothing and leave nothing behind.
    #[cfg(test)]
    pub(crate) fn remove(&self, device: &Device, class: &str) {
        let header = self.header();
        self.with(device, |e| {
            if e.winners.remove(class).is_some() {
                self.save(&header, e, false);
            }
        })
    }

    /// Records a winner and rewrites the file; a failed write is reported with
    /// `HELIOS_VERBOSE=1` and otherwise ignored (the winner still holds for this process).
    pub(crate) fn put(&self, device: &Device, class: &str, variant: &str, us: f64) {
        let header = self.header();
        self.with(device, |e| {
            e.winners.insert(class.to_owned(), (variant.to_owned(), us));
            self.save(&header, e, true);
        })
    }

    /// Rewrites `e`'s file atomically (a temporary file, then a rename): a process killed
    /// meanwhile leaves the old file or the new one, never half of one. Winners that other
    /// processes wrote meanwhile (the other ranks of a data-parallel run, on GPUs of the
    /// same model) are kept with `merge`; this process's own win where both name a class.
    fn save(&self, header: &str, e: &Entries, merge: bool) {
        let Some(path) = e.path.clone() else {
            return;
        };
        let mut all = match merge {
            true => std::fs::read_to_string(&path)
                .map(|text| self.parse(&text))
                .unwrap_or_default(),
            false => HashMap::new(),
        };
        all.extend(e.winners.iter().map(|(k, w)| (k.clone(), w.clone())));
        let mut lines: Vec<String> = all
            .iter()
            .map(|(k, (v, t))| format!("{v}\t{t:.3}\t{k}"))
            .collect();
        lines.sort();
        let text = format!("{header}\n{}\n", lines.join("\n"));
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        let result = path
            .parent()
            .map_or(Ok(()), std::fs::create_dir_all)
            .and_then(|_| std::fs::write(&tmp, text))
            .and_then(|_| std::fs::rename(&tmp, &path));
        if let Err(err) = result {
            if crate::env::verbose() {
                eprintln!(
                    "helios: cannot save {} tuning to {}: {err}",
                    self.family,
                    path.display()
                );
            }
        }
    }

    fn header(&self) -> String {
        format!(
            "# helios {} tuning v{}: variant\tmicroseconds\tclass",
            self.family, self.version
        )
    }

    fn with<T>(&self, device: &Device, f: impl FnOnce(&mut Entries) -> T) -> T {
        let mut guard = self.devices.locked();
        let devices = guard.get_or_insert_with(HashMap::new);
        let key = device.tuning_key_cell().get_or_init(|| device_key(device));
        if let Some(entries) = devices.get_mut(key.as_str()) {
            return f(entries);
        }
        let entries = devices.entry(key.clone()).or_insert_with(|| {
            let path = helios_vk::PipelineCacheDir::from_env()
                .ok()
                .and_then(|dir| dir.root())
                .map(|root| root.join(self.family).join(format!("{key}.tsv")));
            let winners = path
                .as_ref()
                .and_then(|p| std::fs::read_to_string(p).ok())
                .map(|text| self.parse(&text))
                .unwrap_or_default();
            Entries {
                path,
                winners,
                earlier: None,
            }
        });
        f(entries)
    }

    /// The winners in the family's other files for the same device model (with which the
    /// device key, `path`'s name, starts), the most recently written file's first.
    fn earlier_files(&self, path: &std::path::Path) -> HashMap<String, String> {
        let key = path
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or_default();
        let model = key.split('-').next().unwrap_or(key);
        let Some(dir) = path.parent().and_then(|d| std::fs::read_dir(d).ok()) else {
            return HashMap::new();
        };
        let mut files: Vec<(std::time::SystemTime, PathBuf)> = dir
            .flatten()
            .map(|f| f.path())
            .filter(|f| f.as_path() != path && f.extension().is_some_and(|x| x == "tsv"))
            .filter(|f| {
                f.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(&format!("{model}-")))
            })
            .map(|f| {
                let at = std::fs::metadata(&f).and_then(|m| m.modified());
                (at.unwrap_or(std::time::UNIX_EPOCH), f)
            })
            .collect();
        files.sort_by_key(|f| std::cmp::Reverse(f.0));
        let mut earlier = HashMap::new();
        for (_, f) in files {
            let Ok(text) = std::fs::read_to_string(&f) else {
                continue;
            };
            for (class, (variant, _)) in self.parse(&text) {
                earlier.entry(class).or_insert(variant);
            }
        }
        earlier
    }

    fn parse(&self, text: &str) -> HashMap<String, (String, f64)> {
        let mut lines = text.lines();
        if lines.next() != Some(self.header().as_str()) {
            return HashMap::new();
        }
        lines
            .filter_map(|l| {
                let mut parts = l.splitn(3, '\t');
                let v = parts.next()?;
                let us: f64 = parts.next()?.parse().ok()?;
                let class = parts.next()?;
                (self.known)(v).then(|| (class.to_owned(), (v.to_owned(), us)))
            })
            .collect()
    }
}

/// How many tuned winners of the kernel family `family` (`"matmul"`, `"attention"`) are stored
/// on disk for `device` (its driver and enabled features): 0 when none, and then the first
/// use of each shape tunes. Reads the file; for a message before work starts (`helios train`
/// says a cold first step will tune), not for a hot path.
pub fn stored_winners(device: &Device, family: &str) -> usize {
    let key = device.tuning_key_cell().get_or_init(|| device_key(device));
    let Some(root) = helios_vk::PipelineCacheDir::from_env()
        .ok()
        .and_then(|dir| dir.root())
    else {
        return 0;
    };
    std::fs::read_to_string(root.join(family).join(format!("{key}.tsv"))).map_or(0, |text| {
        let mut lines = text.lines();
        let ours = lines
            .next()
            .is_some_and(|h| h.starts_with(&format!("# helios {family} tuning v")));
        if ours {
            lines.filter(|l| !l.trim().is_empty()).count()
        } else {
            0
        }
    })
}

/// `<model>-<driver version>-<features>`: the PCI vendor and device ids in hex, the
/// version with its unusual characters replaced, and [`feature_tag`].
fn device_key(device: &Device) -> String {
    let caps = device.context().caps();
    let safe: String = caps
        .driver_version
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let model = format!("{:04x}_{:04x}", caps.vendor_id, caps.device_id);
    format!("{model}-{safe}-{}", feature_tag(device))
}

/// The kernel families this device may run, as letters: `h` f16 and `b` bf16 cooperative
/// matrices, `w` workgroup-scope matrices, `s` subgroup reductions, `n` native (PTX)
/// kernels (`-` for none).
fn feature_tag(device: &Device) -> String {
    let caps = super::matmul_caps(device);
    let subgroup = matches!(
        device.reducer(),
        helios_kernels::rows::Reducer::Subgroup { .. }
    );
    let tag: String = [
        (caps.coop_f16, 'h'),
        (caps.coop_bf16, 'b'),
        (!caps.coop_wg.is_empty(), 'w'),
        (subgroup, 's'),
        (caps.native.is_some(), 'n'),
    ]
    .iter()
    .filter(|(on, _)| *on)
    .map(|&(_, c)| c)
    .collect();
    if tag.is_empty() {
        "-".into()
    } else {
        tag
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static STORE: TuningStore = TuningStore::new("helios-store-test", 1, |v| v != "gone");

    /// A winner is written atomically and read back by a fresh load; a file of another
    /// driver for the same device gives the first choices of this one (read when first asked
    /// for, not with this driver's file); lines the build does not know and files that are
    /// not the family's are ignored, never an error; winners another process wrote meanwhile
    /// survive this one's writes.
    #[test]
    fn winners_persist_and_a_new_driver_starts_from_the_old_ones() {
        let device = Device::from_env().expect("a Vulkan device");
        let key = device_key(&device);
        let Some(root) = helios_vk::PipelineCacheDir::from_env()
            .ok()
            .and_then(|dir| dir.root())
        else {
            return; // Persistence is off here (HELIOS_CACHE_DIR=off): nothing to check.
        };
        let dir = root.join("helios-store-test");
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("the test's directory");
        let model = key.split('-').next().expect("a model");
        let header = "# helios helios-store-test tuning v1: variant\tmicroseconds\tclass";
        let old_driver = dir.join(format!("{model}-0.0.0_old-x.tsv"));
        std::fs::write(
            &old_driver,
            format!("{header}\nfast\t1.000\tclass a\ngone\t2.000\tclass b\nnot a line\n"),
        )
        .expect("an old driver's file");
        std::fs::write(dir.join(format!("{model}-9.9.9-x.tsv")), "garbage\n").expect("garbage");
        assert_eq!(STORE.get(&device, "class a"), None);
        assert!(
            STORE.with(&device, |e| e.earlier.is_none()),
            "other drivers' files are read only when asked for"
        );
        assert_eq!(STORE.earlier(&device, "class a").as_deref(), Some("fast"));
        assert_eq!(
            STORE.earlier(&device, "class b"),
            None,
            "an unknown variant is dropped"
        );
        assert_eq!(
            STORE.get(&device, "class a"),
            None,
            "not this driver's winner"
        );
        STORE.put(&device, "class a", "faster", 0.5);
        let text = std::fs::read_to_string(dir.join(format!("{key}.tsv"))).expect("written");
        assert_eq!(text, format!("{header}\nfaster\t0.500\tclass a\n"));
        // Another process (a second rank on a GPU of the same model) adds a winner: the next
        // write keeps it.
        std::fs::write(
            dir.join(format!("{key}.tsv")),
            format!("{header}\nfaster\t0.500\tclass a\nfrom another\t3.000\tclass c\n"),
        )
        .expect("another process's write");
        STORE.put(&device, "class d", "mine", 4.0);
        let text = std::fs::read_to_string(dir.join(format!("{key}.tsv"))).expect("written");
        assert_eq!(
            text,
            format!(
                "{header}\nfaster\t0.500\tclass a\nfrom another\t3.000\tclass c\n\
                 mine\t4.000\tclass d\n"
            )
        );
        let leftovers: Vec<_> = std::fs::read_dir(&dir)
            .expect("the directory")
            .flatten()
            .filter(|f| f.path().extension().is_some_and(|x| x != "tsv"))
            .collect();
        assert!(leftovers.is_empty(), "temporary files left: {leftovers:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
