package bundle

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// scanCache remembers wheels that passed Scan, keyed by what stat says
// about the file (size, mtime, ctime, inode, device), so that re-pushing
// an unchanged wheelhouse does not read 1 GB again to learn digests it
// already knew — as git's index does. ctime cannot be set from user
// space, so a file rewritten with its old mtime still misses the cache.
type scanCache struct {
	path    string
	mu      sync.Mutex
	Version int                   `json:"version"`
	Entries map[string]cacheEntry `json:"entries"`
	dirty   bool
}

type cacheEntry struct {
	Stat   fileStat `json:"stat"`
	SHA256 string   `json:"sha256"`
}

// fileStat identifies one version of a file.
type fileStat struct {
	Size  int64  `json:"size"`
	Mtime int64  `json:"mtime"`
	Ctime int64  `json:"ctime"`
	Ino   uint64 `json:"ino"`
	Dev   uint64 `json:"dev"`
}

const maxCacheEntries = 20000

// racyWindow: files changed this close to the scan are not cached.
var racyWindow = 2 * time.Second

// DefaultScanCache is where the CLI keeps the scan cache.
func DefaultScanCache() string {
	d, err := os.UserCacheDir()
	if err != nil {
		return ""
	}
	return filepath.Join(d, "gpupass", "wheel-scan.json")
}

func loadScanCache(path string) *scanCache {
	c := &scanCache{path: path, Version: 1, Entries: map[string]cacheEntry{}}
	if path == "" {
		return c
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return c
	}
	var disk scanCache
	// A cache that does not parse is just empty: it is only a cache.
	if json.Unmarshal(b, &disk) == nil && disk.Version == 1 && disk.Entries != nil {
		c.Entries = disk.Entries
	}
	return c
}

func (c *scanCache) lookup(path string, st fileStat) (string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.Entries[path]
	if !ok || e.Stat != st {
		return "", false
	}
	return e.SHA256, true
}

// remember stores a verified wheel, unless it changed so recently that a
// later write within the clock's granularity could go unnoticed.
func (c *scanCache) remember(path string, st fileStat, sha string, started time.Time) {
	if time.Unix(0, st.Mtime).After(started.Add(-racyWindow)) || time.Unix(0, st.Ctime).After(started.Add(-racyWindow)) {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.Entries) >= maxCacheEntries {
		c.Entries = map[string]cacheEntry{}
	}
	c.Entries[path] = cacheEntry{Stat: st, SHA256: sha}
	c.dirty = true
}

// save writes the cache atomically; failures only cost speed next time.
func (c *scanCache) save() error {
	if c.path == "" || !c.dirty {
		return nil
	}
	c.mu.Lock()
	b, err := json.Marshal(c)
	c.mu.Unlock()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(c.path), 0o700); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(c.path), ".wheel-scan-*")
	if err != nil {
		return err
	}
	_, werr := tmp.Write(b)
	cerr := tmp.Close()
	if err := errors.Join(werr, cerr); err != nil {
		os.Remove(tmp.Name())
		return err
	}
	return os.Rename(tmp.Name(), c.path)
}
