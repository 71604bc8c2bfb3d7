//! The Context's VkPipelineCache, persisted on disk, and cold/warm pipeline-creation stats.
//!
//! The cache file is `<root>/pipelines/<vendor>-<device>-<driver>-<pipelineCacheUUID>.bin`,
//! where `<root>` is `$HELIOS_CACHE_DIR`, else `$XDG_CACHE_HOME/helios`, else
//! `$HOME/.cache/helios`. It is loaded when the Context is created and saved by
//! `Context::save_pipeline_cache` and when the Context drops (only if a pipeline was created
//! since the last save).
//!
//! Key decision: a driver may trust the blob it is given, so nothing reaches it unchecked.
//! The file is a small Helios envelope (magic, blob length, FNV-1a 64 of the blob) around the
//! driver's blob, and the blob's own VkPipelineCacheHeaderVersionOne must match this device
//! (header size, version, vendor, device, UUID). A missing, truncated, bit-flipped or foreign
//! file is ignored with a note (`PipelineStats::cache_note`, printed with HELIOS_VERBOSE=1),
//! never an error. Writes go to a unique temporary file renamed into place, so concurrent
//! processes see the old file or the new one, never half of one. A failed save during drop is
//! printed with HELIOS_VERBOSE=1 and otherwise ignored; an explicit save returns the error.

use crate::sync::LockExt;
use ash::vk;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use crate::env;
use crate::error::{vk_err, Error, Result};

/// `HELIOS_PIPELINE_CACHE=0` keeps the pipeline cache in memory only (nothing read or written).
pub const HELIOS_PIPELINE_CACHE: &str = "HELIOS_PIPELINE_CACHE";
/// `HELIOS_CACHE_DIR=<dir>` replaces `<user cache dir>/helios` as the Helios cache root.
pub const HELIOS_CACHE_DIR: &str = "HELIOS_CACHE_DIR";
/// `HELIOS_VERBOSE=1` prints notes about pipeline cache files ignored or not written.
pub const HELIOS_VERBOSE: &str = "HELIOS_VERBOSE";

/// First 8 bytes of a cache file; the trailing digit is the envelope's format version.
const MAGIC: &[u8; 8] = b"HELIOSP1";
/// Magic, blob length (u64 LE), FNV-1a 64 of the blob (u64 LE).
const ENVELOPE: usize = 24;
/// sizeof(VkPipelineCacheHeaderVersionOne).
const VK_HEADER: usize = 32;

/// Where the pipeline cache persists.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum PipelineCacheDir {
    /// `$XDG_CACHE_HOME/helios` or `$HOME/.cache/helios`; memory only if neither is set.
    #[default]
    User,
    /// This directory is the Helios cache root; the file goes under `<root>/pipelines/`.
    Root(PathBuf),
    /// Memory only: nothing is read or written.
    Disabled,
}

impl PipelineCacheDir {
    /// `HELIOS_PIPELINE_CACHE=0` → `Disabled`; else `HELIOS_CACHE_DIR` → `Root`; else `User`.
    pub fn from_env() -> Result<Self> {
        if env::flag(HELIOS_PIPELINE_CACHE)? == Some(false) {
            return Ok(PipelineCacheDir::Disabled);
        }
        Ok(match env::string(HELIOS_CACHE_DIR) {
            Some(dir) => PipelineCacheDir::Root(dir.into()),
            None => PipelineCacheDir::User,
        })
    }

    /// The Helios cache root this names, or `None` for no persistence.
    pub fn root(&self) -> Option<PathBuf> {
        match self {
            PipelineCacheDir::User => user_root(
                env::string("XDG_CACHE_HOME").as_deref(),
                env::string("HOME").as_deref(),
            ),
            PipelineCacheDir::Root(dir) => Some(dir.clone()),
            PipelineCacheDir::Disabled => None,
        }
    }
}

/// `<XDG_CACHE_HOME>/helios`, else `<HOME>/.cache/helios`. A relative XDG path is invalid per
/// the XDG spec and ignored.
fn user_root(xdg_cache_home: Option<&str>, home: Option<&str>) -> Option<PathBuf> {
    let xdg = xdg_cache_home
        .map(PathBuf::from)
        .filter(|p| p.is_absolute());
    let base = xdg.or_else(|| home.map(|h| Path::new(h).join(".cache")))?;
    Some(base.join("helios"))
}

/// Pipeline creation and cache-file counters, for telling cold starts from warm ones.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PipelineStats {
    /// Pipelines created by this Context.
    pub pipelines_created: u64,
    /// Wall time spent in shader-module, layout and pipeline creation, summed.
    pub total_create_seconds: f64,
    /// Native kernels (`VK_NVX_binary_import`) the driver JIT-compiled for this Context, and
    /// the wall time of those compiles, summed.
    pub native_created: u64,
    pub native_create_seconds: f64,
    /// Bytes of driver cache data handed to the driver at start-up (0: cold start).
    pub cache_loaded_bytes: u64,
    /// The file this Context loads from and saves to; `None` when not persisting.
    pub cache_file: Option<PathBuf>,
    /// Why the last load or save did not happen (no file yet, stale, corrupt, IO error).
    pub cache_note: Option<String>,
}

/// What a device's cache blob must carry in its header to be accepted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct CacheKey {
    vendor_id: u32,
    device_id: u32,
    driver_version: u32,
    uuid: [u8; vk::UUID_SIZE],
}

impl CacheKey {
    fn file_name(&self) -> String {
        let uuid: String = self.uuid.iter().map(|b| format!("{b:02x}")).collect();
        format!(
            "{:04x}-{:04x}-{:08x}-{uuid}.bin",
            self.vendor_id, self.device_id, self.driver_version
        )
    }
}

struct State {
    stats: PipelineStats,
    /// A pipeline was created since the cache was loaded or last saved.
    dirty: bool,
}

pub(crate) struct PipelineCache {
    raw: vk::PipelineCache,
    key: CacheKey,
    verbose: bool,
    /// When the Context started, for the times of `HELIOS_VERBOSE`'s compile lines.
    born: Instant,
    state: Mutex<State>,
}

impl PipelineCache {
    /// Creates the cache, seeded from the file for this device when one is valid.
    pub(crate) fn new(
        instance: &ash::Instance,
        pd: vk::PhysicalDevice,
        device: &ash::Device,
        dir: &PipelineCacheDir,
        verbose: bool,
    ) -> Result<Self> {
        // SAFETY: plain query on a valid physical device.
        let props = unsafe { instance.get_physical_device_properties(pd) };
        let key = CacheKey {
            vendor_id: props.vendor_id,
            device_id: props.device_id,
            driver_version: props.driver_version,
            uuid: props.pipeline_cache_uuid,
        };
        let file = dir
            .root()
            .map(|root| root.join("pipelines").join(key.file_name()));
        let mut note = None;
        let blob = match &file {
            Some(path) => load(path, &key).unwrap_or_else(|why| {
                note = Some(why);
                Vec::new()
            }),
            None => Vec::new(),
        };
        let create = |data: &[u8]| {
            let info = vk::PipelineCacheCreateInfo::default().initial_data(data);
            // SAFETY: valid device; `data` is empty or a blob whose header matches it.
            unsafe { device.create_pipeline_cache(&info, None) }
        };
        let (raw, loaded) = match create(&blob) {
            Ok(raw) => (raw, blob.len()),
            // A driver may still refuse a blob that passed our checks; start cold instead.
            Err(r) if !blob.is_empty() => {
                note = Some(format!("the driver rejected the cached data ({r})"));
                let raw = create(&[]).map_err(vk_err("vkCreatePipelineCache"))?;
                (raw, 0)
            }
            Err(r) => return Err(Error::vk("vkCreatePipelineCache", r)),
        };
        let cache = PipelineCache {
            raw,
            key,
            verbose,
            born: Instant::now(),
            state: Mutex::new(State {
                stats: PipelineStats {
                    cache_loaded_bytes: loaded as u64,
                    cache_file: file,
                    ..Default::default()
                },
                dirty: false,
            }),
        };
        if let Some(note) = note {
            cache.note(note);
        }
        Ok(cache)
    }

    pub(crate) fn born(&self) -> Instant {
        self.born
    }

    pub(crate) fn raw(&self) -> vk::PipelineCache {
        self.raw
    }

    /// Counts one successful compile, of a pipeline or (`native`) a native kernel, begun at
    /// `started`; `HELIOS_VERBOSE=1` prints it with its start, which shows whether the driver
    /// compiles side by side.
    pub(crate) fn record_creation(&self, name: &str, native: bool, started: Instant) {
        let elapsed = started.elapsed();
        if self.verbose {
            eprintln!(
                "helios: compiled {} {name} in {:.0} ms, from {:.0} ms",
                if native { "native kernel" } else { "pipeline" },
                elapsed.as_secs_f64() * 1e3,
                started.saturating_duration_since(self.born).as_secs_f64() * 1e3,
            );
        }
        let mut s = self.state.locked();
        if native {
            s.stats.native_created += 1;
            s.stats.native_create_seconds += elapsed.as_secs_f64();
        } else {
            s.stats.pipelines_created += 1;
            s.stats.total_create_seconds += elapsed.as_secs_f64();
            s.dirty = true;
        }
    }

    /// Writes the driver's cache to the file (temp file + rename). No-op when not persisting.
    pub(crate) fn save(&self, device: &ash::Device) -> Result<()> {
        let Some(path) = self.state.locked().stats.cache_file.clone() else {
            return Ok(());
        };
        // SAFETY: the cache belongs to this device; the driver synchronises cache access.
        let blob = unsafe { device.get_pipeline_cache_data(self.raw) }
            .map_err(vk_err("vkGetPipelineCacheData"))?;
        // A blob we would refuse to load is not worth writing (it would only cause a note).
        if let Err(why) = check_vk_header(&blob, &self.key) {
            self.note(format!(
                "not saved: the driver's cache data is unusable ({why})"
            ));
            return Ok(());
        }
        write_atomically(&path, &envelope(&blob)).map_err(|source| Error::PipelineCacheIo {
            path: path.clone(),
            source,
        })?;
        self.state.locked().dirty = false;
        Ok(())
    }

    /// Saves if a pipeline was created since the last save, then destroys the cache.
    ///
    /// # Safety
    /// No pipeline creation may be in progress or follow.
    pub(crate) unsafe fn destroy(&self, device: &ash::Device) {
        if self.state.locked().dirty {
            if let Err(e) = self.save(device) {
                self.note(format!("not saved: {e}"));
            }
        }
        device.destroy_pipeline_cache(self.raw, None);
    }

    pub(crate) fn stats(&self) -> PipelineStats {
        self.state.locked().stats.clone()
    }

    fn note(&self, note: String) {
        if self.verbose {
            eprintln!("helios: pipeline cache: {note}");
        }
        self.state.locked().stats.cache_note = Some(note);
    }
}

/// Reads and checks a cache file; `Err` carries the reason it is ignored.
fn load(path: &Path, key: &CacheKey) -> std::result::Result<Vec<u8>, String> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(format!("no file yet at {} (cold start)", path.display()))
        }
        Err(e) => return Err(format!("{} ignored: {e}", path.display())),
    };
    open_envelope(&bytes)
        .and_then(|blob| check_vk_header(blob, key).map(|()| blob.to_vec()))
        .map_err(|why| format!("{} ignored: {why}", path.display()))
}

fn envelope(blob: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(ENVELOPE + blob.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&(blob.len() as u64).to_le_bytes());
    out.extend_from_slice(&fnv1a64(blob).to_le_bytes());
    out.extend_from_slice(blob);
    out
}

/// The driver blob inside a file, if the envelope is intact.
fn open_envelope(bytes: &[u8]) -> std::result::Result<&[u8], String> {
    if bytes.len() < ENVELOPE || &bytes[..8] != MAGIC {
        return Err("not a Helios pipeline cache file (bad magic)".into());
    }
    let len = le_u64(&bytes[8..16]);
    let hash = le_u64(&bytes[16..24]);
    let blob = &bytes[ENVELOPE..];
    if blob.len() as u64 != len {
        return Err(format!(
            "truncated or padded: {} bytes of data, header says {len}",
            blob.len()
        ));
    }
    if fnv1a64(blob) != hash {
        return Err("checksum mismatch (corrupt)".into());
    }
    Ok(blob)
}

/// Checks VkPipelineCacheHeaderVersionOne (little-endian by spec, whatever the host).
fn check_vk_header(blob: &[u8], key: &CacheKey) -> std::result::Result<(), String> {
    if blob.len() < VK_HEADER {
        return Err(format!(
            "{} bytes of data, shorter than a Vulkan cache header",
            blob.len()
        ));
    }
    let header_size = le_u32(&blob[0..4]);
    let version = le_u32(&blob[4..8]);
    let vendor_id = le_u32(&blob[8..12]);
    let device_id = le_u32(&blob[12..16]);
    let uuid = &blob[16..32];
    if (header_size as usize) < VK_HEADER || header_size as usize > blob.len() {
        return Err(format!("bad header size {header_size}"));
    }
    if version != vk::PipelineCacheHeaderVersion::ONE.as_raw() as u32 {
        return Err(format!("unknown header version {version}"));
    }
    if vendor_id != key.vendor_id || device_id != key.device_id {
        return Err(format!(
            "made for device {vendor_id:04x}:{device_id:04x}, not {:04x}:{:04x} (stale)",
            key.vendor_id, key.device_id
        ));
    }
    if uuid != key.uuid {
        return Err("pipeline cache UUID differs (driver changed; stale)".into());
    }
    Ok(())
}

/// Writes `bytes` to a unique sibling temp file and renames it over `path`.
fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let unique = COUNTER.fetch_add(1, Ordering::Relaxed);
    let tmp = dir.join(format!(".{name}.{}-{unique}.tmp", std::process::id()));
    let written = std::fs::write(&tmp, bytes).and_then(|()| std::fs::rename(&tmp, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// FNV-1a, 64-bit: detects corruption, not tampering (the file is the user's own).
fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

fn le_u32(b: &[u8]) -> u32 {
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

fn le_u64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_le_bytes(a)
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: CacheKey = CacheKey {
        vendor_id: 0x10de,
        device_id: 0x2335,
        driver_version: 0x9160_4000,
        uuid: [7; 16],
    };

    fn blob(key: &CacheKey, body: &[u8]) -> Vec<u8> {
        let mut b = Vec::new();
        for v in [32, 1, key.vendor_id, key.device_id] {
            b.extend_from_slice(&u32::to_le_bytes(v));
        }
        b.extend_from_slice(&key.uuid);
        b.extend_from_slice(body);
        b
    }

    #[test]
    fn file_name_and_roots() {
        assert_eq!(
            KEY.file_name(),
            "10de-2335-91604000-07070707070707070707070707070707.bin"
        );
        assert_eq!(
            user_root(Some("/x/cache"), Some("/home/u")),
            Some(PathBuf::from("/x/cache/helios"))
        );
        assert_eq!(
            user_root(Some("relative"), Some("/home/u")),
            Some(PathBuf::from("/home/u/.cache/helios"))
        );
        assert_eq!(user_root(None, None), None);
        assert_eq!(PipelineCacheDir::Disabled.root(), None);
        let root = PipelineCacheDir::Root("/r".into()).root();
        assert_eq!(root, Some(PathBuf::from("/r")));
    }

    #[test]
    fn envelope_round_trip_and_damage() {
        let good = blob(&KEY, b"driver data");
        let file = envelope(&good);
        assert_eq!(open_envelope(&file), Ok(&good[..]));
        assert!(check_vk_header(&good, &KEY).is_ok());

        let truncated = &file[..file.len() - 1];
        assert!(open_envelope(truncated).unwrap_err().contains("truncated"));
        let mut flipped = file.clone();
        *flipped.last_mut().unwrap() ^= 1;
        assert!(open_envelope(&flipped).unwrap_err().contains("checksum"));
        assert!(open_envelope(b"garbage").unwrap_err().contains("magic"));
        assert!(open_envelope(&good).unwrap_err().contains("magic"));
    }

    #[test]
    fn header_checks() {
        let other_device = CacheKey {
            device_id: 1,
            ..KEY
        };
        let other_uuid = CacheKey {
            uuid: [8; 16],
            ..KEY
        };
        for (data, want) in [
            (blob(&other_device, b""), "stale"),
            (blob(&other_uuid, b""), "UUID"),
            (blob(&KEY, b"")[..31].to_vec(), "shorter"),
        ] {
            let err = check_vk_header(&data, &KEY).unwrap_err();
            assert!(err.contains(want), "{err}");
        }
        let mut bad_version = blob(&KEY, b"");
        bad_version[4] = 2;
        assert!(check_vk_header(&bad_version, &KEY)
            .unwrap_err()
            .contains("version"));
        let mut bad_size = blob(&KEY, b"");
        bad_size[0] = 64;
        assert!(check_vk_header(&bad_size, &KEY)
            .unwrap_err()
            .contains("header size"));
    }

    #[test]
    fn atomic_write_replaces_and_leaves_no_temp() {
        let dir = std::env::temp_dir().join(format!("helios-pc-unit-{}", std::process::id()));
        let path = dir.join("sub").join("f.bin");
        write_atomically(&path, b"one").unwrap();
        write_atomically(&path, b"two").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
        let entries = std::fs::read_dir(path.parent().unwrap()).unwrap().count();
        assert_eq!(entries, 1, "temp files left behind");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
