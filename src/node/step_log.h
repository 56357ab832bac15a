// StepLog: the trajectory log. Per sandbox, an append-only, ordered, durable record of
// every state-changing call (with its request, its complete answer, timing and caller)
// and of what the node did to it (created, a background process ended, ended); plus one
// node-wide file for keyed calls about no single sandbox (create, batch, images).
// docs/trajectory-log.md describes the format (node/step_format.h is its codec) and
// the semantics.
//
// Layout under <data_dir>:
//   sandboxes/<id>/steps.log         records of sandbox <id>, seq 1, 2, ... in order
//   sandboxes/<id>/steps.d/<n>.body  answers and request bodies larger than inline_max
//   steps/global.log, steps/steps.d/ the node-wide log and its side files
//
// Durability: a side file is written and fdatasync'ed (and its directory fsync'ed)
// before the record naming it is appended; a record is appended and the log
// fdatasync'ed before append()'s callback runs, i.e. before the caller sends the
// answer. A new log's header goes with its first records, in that one fdatasync, and
// its directories are fsync'ed after it (skipped on file systems whose file fsync
// makes a new file's name durable: ext4, XFS, tmpfs; see Options::always_sync_dirs).
// Lazy events (append_event) are written but ride on the log's next synced record; a
// new log made by one is fdatasync'ed in the background at once (a hint only), so that
// the sandbox's first call pays an overwrite's sync, not a new file's.
// One commit runs at a time: an append() that finds none running and nothing
// queued commits its record on the caller's thread (no wake-up of another thread on
// either side of the sync, which on a guest costs as much as the sync itself); the
// records that arrive while a commit syncs are queued, and the writer thread writes
// and syncs them together (group commit), the logs of a batch at once (their flushes
// merge in the block layer). A new log is one 4 KiB block; past it, a log grows in
// preallocated pieces (zeros written and synced once), so that an append overwrites allocated
// blocks and its fdatasync need not commit a new file size; the zeros after the last record are cut
// away when its sandbox ends, and at open.
//
// Timestamps: a write moves the file's mtime when the kernel's coarse clock has ticked
// since the last one. fdatasync leaves a new mtime alone on most file systems, but ext4
// without a journal writes the inode's block for it, one more write before the flush.
// There hold() (a call begins) moves the mtime of a log not written for 50 ms (a
// sandbox's first call after a pause) and syncs it in the background while the call
// runs; the call's record, written in the same tick, then finds the inode clean. Calls
// in a busy loop, which seldom end in the tick they began, are left as they were.
//
// Recovery (open): each log is read record by record (with Options::read_first, only
// the logs it names before open() returns; the rest by a background thread after, see
// there). A final record cut short (a crash mid-write: too few bytes for its header or
// its len, or a bad crc on a record followed only by zeros) is cut away and never
// returned. A bad record in the middle (or a bad
// file header) stops the reading there: the error is logged, the file is kept as
// steps.log.damaged-<unix s> for inspection, and a fresh steps.log holds the good
// records before the damage. A file of a newer format is left alone (and never
// written). Side files no record names (a crash between side file and record) are
// deleted. Version 1 files are read and their header is rewritten as version 2 (their
// records are valid version 2 records; their seq is their place in the file).
//
// Spare logs (Options::spares, make_id): a background thread keeps up to `spares`
// sandbox logs made ahead under steps/spare/<id>/steps.log (directory, file, header and
// first block written, and their metadata committed by one fdatasync per batch), so
// that a new sandbox's log costs a rename of its directory instead of a mkdir, a create
// and a new file's first sync (each a metadata change that, on a journalled file
// system, the sandbox's first synced record would wait for). take_spare() hands out
// the id of one; the log's first record renames it to sandboxes/<id>. The rename
// itself is not synced: a spare found at open with records in it is moved then; one
// without is deleted (its id is never used again).
//
// Intents: a keyed call's intent (step_format.h, is_intent) is written, unsynced, before
// its handler runs; at open an intent with no record of its key after it is a call the
// daemon died answering, answered 503 by answer_interrupted(), so that its retry does
// not run it again. Intents have no seq and are not listed.
//
// Memory: the key index key -> (log, offset, finish time), at most max_keys entries,
// and per log the offset of each seq; records and answers are read from disk when
// asked for.
//
// Ordering: seq follows the order of append() calls per log. A sandbox's "ended" event
// (append_event with after_calls) waits until every call of that sandbox that was
// being answered (hold/release) has been appended, so every call that ran is before it.
//
// Retention: a sandbox's log is deleted once the sandbox is not live (the is_live
// callback) and its log was last written or ended (sandbox_ended()) more than
// `retention` ago; checked at open and then periodically by the writer thread. Keys of
// the node-wide log are forgotten after `retention`; the file itself is compacted at
// open (records older than retention dropped). Time comes from Options::clock.
//
// Thread rules: every method is safe from any thread. Callbacks (append's done,
// when_after's) run on the writer thread, on the thread of an append() that commits
// inline, or on the caller's, and must not block for long.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/result.h"
#include "node/step_format.h"

namespace tp::node {

// Where a record is: which log, at which offset.
struct StepLocation {
  uint32_t log = 0;
  uint64_t offset = 0;
  int64_t finished_us = 0;
};

// What a log holds at the moment.
struct StepLogInfo {
  bool exists = false;    // a file with at least its header
  uint64_t last_seq = 0;  // 0: no record
  uint64_t records = 0;
  uint64_t bytes = 0;   // records and side files (not the preallocated zeros)
  bool ended = false;   // its "ended" event is in it
  bool closed = false;  // its sandbox ended and what was queued for it then is written
  bool busy = false;    // calls are being answered, or an event waits for them
};

// A body being written straight to a side file (a streamed answer), so that it never
// sits whole in memory. Owned by one caller at a time.
class StepSideFile {
 public:
  ~StepSideFile();
  Result<void> write(std::string_view data);
  uint64_t size() const { return size_; }

 private:
  friend class StepLog;
  int fd_ = -1;
  std::string dir_, name_;
  uint64_t size_ = 0;
  uint32_t crc_ = 0;
  bool failed_ = false;
  bool kept_ = false;  // named by a committed record: not deleted on destruction
};

class StepLog {
 public:
  using Clock = std::function<int64_t()>;  // unix microseconds
  using IsLive = std::function<bool(const std::string& sandbox_id)>;
  struct Options {
    std::string data_dir;
    std::chrono::seconds retention{24 * 3600};
    size_t max_keys = 1'000'000;
    size_t inline_max = 64 << 10;
    IsLive is_live;  // see set_is_live
    Clock clock;     // default: the system clock (tests pass a fake one)
    // First preallocated piece of a log; it doubles up to 1 MiB as the log grows. 0: none.
    size_t prealloc = 64 << 10;
    // Request bodies up to this size are kept (replay input); larger ones only by digest.
    size_t max_request_body = 16 << 20;
    // append() may commit on the caller's thread (see Durability above); false: the
    // writer thread does every commit.
    bool inline_commit = true;
    // fsync the directories of new files and side files even on a file system whose
    // file fsync makes new names durable (ext4, XFS, tmpfs), where they are skipped.
    bool always_sync_dirs = false;
    // Sandbox logs made ahead (see "Spare logs" above); 0: none. make_id makes the ids
    // of spares (a fresh sandbox id each call); spares need it.
    size_t spares = 0;
    std::function<std::string()> make_id;
    // The sandbox logs open() reads before it returns (the sandboxes still running,
    // whose calls come first); the others are read after it by a background thread, so
    // that a restart serves as soon as those are read, however long the node's history.
    // That thread first deletes what retention allows (open() does it itself when
    // read_first is null), and runs at the lowest priority while no call waits for it.
    // A call that touches a log not read yet reads it on its own thread first (or waits
    // for the thread reading it); find(), size() and full() wait until every log is read
    // (a key may be in any of them), and so does sweep(). The intents those logs hold
    // are answered as answer_interrupted() does, by that thread. Null: every log is read
    // before open() returns.
    std::function<bool(const std::string& sandbox_id)> read_first;
    // hold() moves the log's mtime and syncs its inode in the background when the log was
    // not written for touch_after (see "Timestamps" above). Unset: on ext4 without a
    // journal, the one file system here whose fdatasync writes the inode for a new mtime.
    std::optional<bool> touch_ahead;
    std::chrono::milliseconds touch_after{50};
  };

  // Reads the logs under data_dir (recovering torn tails; all of them, or those of
  // Options::read_first), deletes what retention allows, and starts the writer thread
  // (and the one that reads the other logs).
  static Result<std::unique_ptr<StepLog>> open(Options opts);
  ~StepLog();
  StepLog(const StepLog&) = delete;
  StepLog& operator=(const StepLog&) = delete;

  // Which log a call belongs to: the sandbox id of /v1/sandboxes/<id>[/...], or
  // "" (the node-wide log) for any other path.
  static std::string scope_of(std::string_view path);
  // "90s", "30m", "24h", "7d" or plain seconds.
  static Result<std::chrono::seconds> parse_duration(std::string_view s);

  int64_t now_us() const;

  // ---- keys
  std::optional<StepLocation> find(const std::string& key);
  // Reads a record; with_answer also reads the answer body (from its side file).
  Result<StepRecord> read(const StepLocation& loc, bool with_answer);
  size_t size();  // keys indexed
  bool full();
  size_t inline_max() const { return opts_.inline_max; }
  size_t max_request_body() const { return opts_.max_request_body; }

  // ---- a sandbox's log in order
  StepLogInfo info(const std::string& scope);
  // The records with seq > after, in order, at most `limit` of them; with_answer also
  // reads each answer from its side file, and stops before the record whose answer
  // would bring their total past max_answer_bytes (the first one always comes).
  Result<std::vector<StepRecord>> list(const std::string& scope, uint64_t after, size_t limit,
                                       bool with_answer, uint64_t max_answer_bytes = UINT64_MAX);
  // The request body of a call record (inline or from its side file); nullopt when it
  // was not kept (larger than the recorded maximum).
  Result<std::optional<std::string>> request_body(const std::string& scope, const StepRecord& rec);
  // Runs cb once when the log of `scope` has a record with seq > after, or is ended
  // or removed: at once (on this thread) if it has, else on the thread that commits
  // that record (the writer's or an inline append's).
  void when_after(const std::string& scope, uint64_t after, std::function<void()> cb);
  // Forgets every when_after callback; once it returns none runs (the owner of the
  // callbacks is going away).
  void drop_waiters();

  // ---- appending
  // Starts a side file for an answer of `scope` (a streamed answer).
  Result<std::unique_ptr<StepSideFile>> new_side(const std::string& scope);
  // Appends rec durably; `answer` is the body when `side` is null (it goes inline or
  // into a new side file by size) and is handed back to `done` with the result. A
  // request body larger than inline_max goes to a side file. rec.seq is assigned.
  // `done` may run before append() returns, on this thread (an inline commit: the
  // caller must not hold a lock that done takes). release_hold: also release() the
  // caller's hold of `scope`; the events that waited for it are then committed with
  // this record (one sync, on this thread when it commits inline).
  using Done = std::function<void(Result<void>, std::string answer)>;
  void append(const std::string& scope, StepRecord rec, std::string answer,
              std::unique_ptr<StepSideFile> side, Done done, bool release_hold = false);
  // Blocking append, for tests and tools.
  Result<void> append_sync(const std::string& scope, StepRecord rec, std::string answer);
  // Appends an event (kind 2) to a sandbox's log. after_calls: only once no call of the
  // sandbox is held (see hold()), so that it follows every call being answered. With
  // a `done` and without after_calls it may be committed inline, as append(). lazy:
  // `done` runs once the event is written (a daemon that dies keeps it: it is in the
  // page cache), and it is made durable by the log's next record that is not lazy, so
  // that it costs no fdatasync of its own (a machine that loses power before that
  // record loses it).
  void append_event(const std::string& scope, std::string event, std::string detail_json,
                    bool after_calls, Done done = nullptr, bool lazy = false);
  // A call of `scope` is being answered: an after_calls event waits for its release,
  // which the caller makes once its record was handed to append(). May start the log's
  // inode write ahead of the record (Options::touch_ahead).
  void hold(const std::string& scope);
  void release(const std::string& scope);

  // ---- spare logs
  // The id of a sandbox whose log is made already (see "Spare logs"), for a new
  // sandbox; nullopt when none is ready (the caller makes an id of its own).
  std::optional<std::string> take_spare();
  // A spare's id that no sandbox got (its create was refused first): ready again when
  // `reuse` (nobody saw the id), else its log is removed. Ids not taken are ignored.
  void return_spare(const std::string& id, bool reuse);
  // Spares ready now (tests, metrics).
  size_t spares_ready();

  // ---- intents (docs/trajectory-log.md, "A daemon that dies mid-call")
  // A keyed call of `scope` begins (`call`: its key, request, caller, started_us): its
  // intent goes to the log its answer will go to, ahead of that answer. Not synced: the
  // answer's fdatasync takes it along, and a daemon that dies keeps it (page cache).
  // Never waits: written on this thread when no commit runs, else queued.
  void append_intent(const std::string& scope, const StepRecord& call);
  // Records every call whose intent open() found with no answer after it, and whose
  // key has no record by now, as answered 503 ("the daemon restarted while this call
  // was being answered"), durably, one record per key; returns how many. Called once
  // after open, after what records a more precise outcome of such calls (the sandbox
  // manager's recover(): a keyed command's own 503); until then their keys are unknown.
  size_t answer_interrupted();

  // ---- lifecycle
  // Starts the retention clock of the sandbox's log and trims its preallocated tail
  // (and closes its descriptor); is_live tells the sweep which
  // sandboxes still run (without it every sandbox counts as ended).
  void sandbox_ended(const std::string& sandbox_id);
  void set_is_live(IsLive f);
  // Deletes what retention allows now (also run periodically).
  void sweep();

 private:
  struct File;
  struct Pending;
  struct Log;
  class SyncPool;
  explicit StepLog(Options opts);
  // Threads that read the logs back at open (load_all()).
  static constexpr size_t kLoaders = 4;
  Result<void> load_all();
  // Reads one log back; the intents it holds without an answer go to *lost.
  Result<void> load(uint32_t log, std::vector<std::pair<uint32_t, StepRecord>>* lost);
  // Reads a log that open() left for later, unless read already (mu_ held by lk; it is
  // released while reading, and while another thread reads it).
  void load_locked(std::unique_lock<std::mutex>& lk, uint32_t log);
  // What every method that touches the log of `scope` calls first.
  void ensure_loaded(const std::string& scope);
  // The background reader: the logs open() left, then their intents answered.
  void load_rest(std::vector<uint32_t> logs);
  // Waits (mu_ held by lk) until every log is read, or the log is closing.
  void wait_all_loaded(std::unique_lock<std::mutex>& lk);
  // The reader's threads: lowest priority unless a call waits for them.
  void reader_priority();
  // Deletes the logs past retention whose sandboxes are not live (sweep() once every log
  // is read; the background reader before it reads the others, skipping any log a call
  // reads back meanwhile).
  void remove_expired(bool from_reader);
  size_t answer_lost(std::vector<std::pair<uint32_t, StepRecord>> lost);
  uint32_t log_id_locked(const std::string& scope);
  std::string dir_of(const std::string& scope) const;
  // existing_only: a log already written, opened as it is (never made or placed).
  Result<File*> file_for(uint32_t log, bool existing_only = false);
  // hold()'s mtime move and background sync (see "Timestamps" above).
  void touch_ahead(uint32_t log);
  Result<StepRecord> read_at(int fd, const std::string& path, uint64_t offset);
  Result<void> read_side(const std::string& dir, const std::string& name, uint64_t len,
                         std::string* out);
  void run();
  // Queues ps in order (mu_ held by lk, released on return) and, may_inline, no commit
  // running and nothing queued before, commits them on this thread.
  void submit_locked(std::unique_lock<std::mutex>& lk, std::vector<Pending> ps, bool may_inline);
  void commit(std::vector<Pending>& batch);
  void fire_waiters_locked(Log& l, std::vector<std::function<void()>>* out);

  const Options opts_;
  std::mutex mu_;  // index_, logs_, scope_ids_, pending_, stop_, busy_
  std::condition_variable cv_;
  std::unordered_map<std::string, StepLocation> index_;
  std::vector<std::unique_ptr<Log>> logs_;  // log id -> its state (id 0: node-wide)
  std::unordered_map<std::string, uint32_t> scope_ids_;
  std::deque<Pending> pending_;
  // Intents without an answer found by open(): (log, intent), until answer_interrupted().
  std::vector<std::pair<uint32_t, StepRecord>> interrupted_;
  // Logs open() left to the background reader (see Options::read_first).
  std::vector<uint32_t> read_later_;
  std::atomic<size_t> unread_{0};       // of them, not read yet (ensure_loaded's fast path)
  std::atomic<int> reader_waiters_{0};  // calls waiting for the reader (reader_priority())
  bool all_read_ = true;                // every log read and its intents answered
  bool read_stop_ = false;              // closing: the reader stops between logs
  std::condition_variable read_cv_;     // with mu_: a log read, all_read_, read_stop_
  std::vector<std::pair<uint32_t, StepRecord>> lost_later_;  // intents of those logs
  std::thread reader_;
  IsLive is_live_;
  bool stop_ = false;
  bool busy_ = false;         // a commit (or the sweep) runs: at most one at a time, in queue order
  bool sweep_waits_ = false;  // the writer waits for an inline commit to end
  bool sync_dirs_ = true;     // set at open (Options::always_sync_dirs, the file system)
  bool sync_each_spare_ = false;  // set at open: ext4 without a journal (make_spares)
  bool touch_ahead_ = false;      // set at open: Options::touch_ahead, else the same test
  uint64_t side_seq_ = 0;
  // Owned by whoever commits (busy_), and by load at open, before the writer starts.
  std::unordered_map<uint32_t, std::unique_ptr<File>> files_;  // at most kOpenLogs + 1
  uint64_t commits_ = 0;
  std::mutex files_mu_;  // files_ against sandbox_ended/sweep from other threads
  std::mutex fire_mu_;   // held while when_after callbacks run (drop_waiters waits for it)
  void fire(std::vector<std::function<void()>>& wake);
  std::unique_ptr<SyncPool> sync_pool_;
  std::thread writer_;

  // Spare logs: made by spare_thread_, handed out by take_spare(), renamed into place
  // by file_for() (on the committing thread).
  std::string spare_dir() const;
  void recover_spares();
  void make_spares();
  // Moves the spare of `scope` to dir (its log's directory); false: it is not there.
  bool place_spare(const std::string& scope, const std::string& dir);
  std::mutex spare_mu_;  // spares_, spares_taken_, spare_stop_
  std::condition_variable spare_cv_;
  std::deque<std::string> spares_;                // ready, oldest first
  std::unordered_set<std::string> spares_taken_;  // handed out, not yet placed
  bool spare_stop_ = false;
  std::thread spare_thread_;
};

}  // namespace tp::node
