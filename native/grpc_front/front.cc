// dlaas-grpc-front: the scoring gRPC port's transport, outside Python.
//
// It speaks gRPC (HTTP/2, HPACK, framing, flow control, deadlines, the receive cap) with
// the callers and nothing else: every decision stays in the API process that started it
// (service/scoring/grpc_front.py), which it talks to over one inherited Unix socket in
// small binary frames. For every call it sends the method, the peer and the metadata, and
// reads the call's message only once the API process has checked the caller and said
// PROCEED; then it sends the message's bytes as they came and ends the call with the
// status, trailing metadata and answer bytes the API process gives. It parses no message
// and holds no key, table or tenant state, but one thing: a connection whose last call
// with some `authorization` passed the API process's check has that value remembered
// (APPROVED in FINISH), and its next call with the same value is read at once, without
// waiting for PROCEED (the API process still checks it before using the message); a call
// that does not pass forgets it. A caller that has never passed is never read unchecked.
//
// Frames, both ways: u32 length (of what follows), u8 type, u64 call id, payload; the
// integers little-endian, a string a u32 length and its bytes.
//   front -> API: READY (u32 port), FAILED (string), CALL (u32 flags: READING, method,
//                 peer, u32 n, n x (key, value)), MESSAGE (the bytes), NO_MESSAGE,
//                 CANCELLED.
//   API -> front: PROCEED, FINISH (u32 flags: APPROVED, u32 code, string detail, u32 n,
//                 n x (key, value), the answer's bytes), STOP (u32 grace in ms).
//
//   dlaas-grpc-front --fd N --listen HOST:PORT --max-receive BYTES [--seccomp FD]
//
// It exits when the socket closes (the API process is gone) or after STOP, and dies with
// its parent (PR_SET_PDEATHSIG). With --seccomp, once it listens (and before READY) it
// loads the BPF program read from FD as a seccomp filter on all its threads
// (service/sandbox/seccomp.py compiles it: no new sockets, connections or listeners), so
// that nothing it runs afterwards reaches the network it shares with the platform.

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

namespace {

enum FrameType : uint8_t {
  kReady = 1,
  kFailed = 2,
  kCall = 3,
  kMessage = 4,
  kNoMessage = 5,
  kCancelled = 6,
  kProceed = 10,
  kFinish = 11,
  kStop = 12,
};

constexpr uint32_t kReading = 1;   // CALL: the message is being read already
constexpr uint32_t kApproved = 1;  // FINISH: the call passed the caller's check
// Connections remembered at most (forgotten all at once past it).
constexpr size_t kMaxApproved = 4096;

constexpr size_t kHeader = 4 + 1 + 8;
// The API process's frames are trusted, but a length past this is a broken stream.
constexpr uint32_t kMaxFrame = 1u << 31;

// ---- frames --------------------------------------------------------------------------

class Out {
 public:
  Out(FrameType type, uint64_t id) {
    buf_.resize(kHeader);
    buf_[4] = static_cast<char>(type);
    std::memcpy(&buf_[5], &id, 8);
  }
  void u32(uint32_t v) { buf_.append(reinterpret_cast<const char*>(&v), 4); }
  void str(const char* data, size_t n) {
    u32(static_cast<uint32_t>(n));
    buf_.append(data, n);
  }
  void str(const std::string& s) { str(s.data(), s.size()); }
  void raw(const char* data, size_t n) { buf_.append(data, n); }
  // A message's bytes, slice by slice; false if gRPC could not hand them over.
  bool raw(const grpc::ByteBuffer& buffer) {
    std::vector<grpc::Slice> slices;
    if (!buffer.Dump(&slices).ok()) return false;
    buf_.reserve(buf_.size() + buffer.Length());
    for (const auto& s : slices) raw(reinterpret_cast<const char*>(s.begin()), s.size());
    return true;
  }
  std::string done() {
    uint32_t n = static_cast<uint32_t>(buf_.size() - 4);
    std::memcpy(&buf_[0], &n, 4);
    return std::move(buf_);
  }

 private:
  std::string buf_;
};

class In {
 public:
  In(const char* p, size_t n) : p_(p), end_(p + n) {}
  bool u32(uint32_t* v) {
    if (end_ - p_ < 4) return false;
    std::memcpy(v, p_, 4);
    p_ += 4;
    return true;
  }
  bool str(std::string* s) {
    uint32_t n;
    if (!u32(&n) || static_cast<size_t>(end_ - p_) < n) return false;
    s->assign(p_, n);
    p_ += n;
    return true;
  }
  const char* rest() const { return p_; }
  size_t left() const { return static_cast<size_t>(end_ - p_); }

 private:
  const char* p_;
  const char* end_;
};

// ---- the socket to the API process ---------------------------------------------------

int g_fd = -1;

bool write_all(const std::string& data) {
  const char* p = data.data();
  size_t left = data.size();
  while (left > 0) {
    ssize_t n = ::send(g_fd, p, left, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    left -= static_cast<size_t>(n);
  }
  return true;
}

// Frames for the API process, written by the completion-queue thread in one send per
// drain of the queue (and by main before it starts).
class Outbox {
 public:
  void add(std::string frame) {
    if (pending_.empty()) {
      pending_ = std::move(frame);
    } else {
      pending_ += frame;
    }
  }
  void flush() {
    if (pending_.empty()) return;
    if (!write_all(pending_)) {
      // The API process is gone: nothing here may answer for it.
      std::_Exit(0);
    }
    pending_.clear();
  }

 private:
  std::string pending_;
};

// ---- calls ---------------------------------------------------------------------------

struct Call;

enum class Op { kNew, kRead, kFinish, kDone };

struct Tag {
  Call* call;
  Op op;
};

struct Call {
  uint64_t id = 0;
  grpc::GenericServerContext ctx;
  grpc::GenericServerAsyncReaderWriter stream{&ctx};
  grpc::ByteBuffer message;
  std::string peer;
  std::string authorization;
  Tag new_tag{this, Op::kNew};
  Tag read_tag{this, Op::kRead};
  Tag finish_tag{this, Op::kFinish};
  Tag done_tag{this, Op::kDone};
  // Guarded by g_mu.
  bool done = false;      // the done tag came back
  bool finishing = false;  // Finish or WriteAndFinish was started
  int pending = 0;        // operations started whose tag has not come back
};

std::mutex g_mu;
std::unordered_map<uint64_t, Call*> g_calls;  // the calls the API process may answer
// Peer -> the `authorization` of its last call that passed the check.
std::unordered_map<std::string, std::string> g_approved;
uint64_t g_next_id = 1;

grpc::AsyncGenericService g_service;
std::unique_ptr<grpc::ServerCompletionQueue> g_cq;
std::unique_ptr<grpc::Server> g_server;
std::atomic<bool> g_shutting_down{false};
bool g_queue_closed = false;  // guarded by g_mu: no operation may start any more

void await_next_call() {
  if (g_shutting_down.load()) return;
  Call* call = new Call();
  call->ctx.AsyncNotifyWhenDone(&call->done_tag);
  g_service.RequestCall(&call->ctx, &call->stream, g_cq.get(), g_cq.get(), &call->new_tag);
}

// With g_mu held: delete `call` once nothing of grpc refers to it any more.
void maybe_free(Call* call) {
  if (call->done && call->pending == 0) {
    g_calls.erase(call->id);
    delete call;
  }
}

// The completion-queue thread's handling of one tag; frames for the API process go to
// `out`.
void handle(Tag* tag, bool ok, Outbox* out) {
  Call* call = tag->call;
  switch (tag->op) {
    case Op::kNew: {
      if (!ok) {
        // The server is shutting down: this call never arrived, and its done tag
        // will not come back.
        delete call;
        return;
      }
      await_next_call();
      call->peer = call->ctx.peer();
      const auto& metadata = call->ctx.client_metadata();
      auto auth = metadata.find("authorization");
      if (auth != metadata.end()) {
        call->authorization.assign(auth->second.data(), auth->second.size());
      }
      uint32_t flags = 0;
      {
        std::lock_guard<std::mutex> lock(g_mu);
        call->id = g_next_id++;
        g_calls[call->id] = call;
        auto seen = g_approved.find(call->peer);
        if (!call->authorization.empty() && seen != g_approved.end() &&
            seen->second == call->authorization) {
          flags |= kReading;
          call->pending++;
          call->stream.Read(&call->message, &call->read_tag);
        }
      }
      Out frame(kCall, call->id);
      frame.u32(flags);
      frame.str(call->ctx.method());
      frame.str(call->peer);
      frame.u32(static_cast<uint32_t>(metadata.size()));
      for (const auto& [key, value] : metadata) {
        frame.str(key.data(), key.size());
        frame.str(value.data(), value.size());
      }
      out->add(frame.done());
      return;
    }
    case Op::kRead: {
      uint64_t id;
      {
        std::lock_guard<std::mutex> lock(g_mu);
        id = call->id;
      }
      Out frame(ok ? kMessage : kNoMessage, id);
      if (ok && !frame.raw(call->message)) frame = Out(kNoMessage, id);
      call->message.Clear();
      std::lock_guard<std::mutex> lock(g_mu);
      call->pending--;
      if (call->done) {
        maybe_free(call);
        return;  // CANCELLED was (or will be) sent
      }
      out->add(frame.done());
      return;
    }
    case Op::kFinish: {
      std::lock_guard<std::mutex> lock(g_mu);
      call->pending--;
      maybe_free(call);
      return;
    }
    case Op::kDone: {
      bool cancelled = call->ctx.IsCancelled();
      uint64_t id;
      {
        std::lock_guard<std::mutex> lock(g_mu);
        call->done = true;
        id = call->id;
        bool answered = call->finishing;
        // No answer will be sent now: the API process stops working on the call.
        g_calls.erase(id);
        maybe_free(call);
        if (answered && !cancelled) return;
      }
      out->add(Out(kCancelled, id).done());
      return;
    }
  }
}

// Serves the completion queue until it is shut down (after STOP), then ends the process.
void serve_queue() {
  Outbox out;
  void* tag;
  bool ok;
  while (true) {
    // Block for the next event, then take every one ready before writing their frames
    // in one send.
    if (!g_cq->Next(&tag, &ok)) break;
    handle(static_cast<Tag*>(tag), ok, &out);
    while (true) {
      // A deadline in the past polls without waiting; "now" rounds up to a millisecond.
      auto status = g_cq->AsyncNext(&tag, &ok, gpr_inf_past(GPR_CLOCK_MONOTONIC));
      if (status != grpc::CompletionQueue::GOT_EVENT) break;
      handle(static_cast<Tag*>(tag), ok, &out);
    }
    out.flush();
  }
  out.flush();
  std::_Exit(0);
}

// ---- what the API process says -------------------------------------------------------

void proceed(uint64_t id) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = g_calls.find(id);
  if (it == g_calls.end()) return;  // ended meanwhile
  Call* call = it->second;
  if (g_queue_closed || call->done || call->finishing || call->pending > 0) return;
  call->pending++;
  call->stream.Read(&call->message, &call->read_tag);
}

bool finish(uint64_t id, In* in) {
  uint32_t flags, code, n;
  std::string detail;
  if (!in->u32(&flags) || !in->u32(&code) || !in->str(&detail) || !in->u32(&n)) return false;
  std::vector<std::pair<std::string, std::string>> trailing;
  for (uint32_t i = 0; i < n; ++i) {
    std::string key, value;
    if (!in->str(&key) || !in->str(&value)) return false;
    trailing.emplace_back(std::move(key), std::move(value));
  }
  if (code > 16) code = grpc::StatusCode::UNKNOWN;
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = g_calls.find(id);
  if (it == g_calls.end()) return true;
  Call* call = it->second;
  if ((flags & kApproved) && !call->authorization.empty()) {
    if (g_approved.size() >= kMaxApproved) g_approved.clear();
    g_approved[call->peer] = call->authorization;
  } else {
    g_approved.erase(call->peer);
  }
  if (g_queue_closed || call->done || call->finishing) return true;
  call->finishing = true;
  for (auto& [key, value] : trailing) call->ctx.AddTrailingMetadata(key, value);
  call->pending++;
  if (code == grpc::StatusCode::OK) {
    grpc::Slice slice(in->rest(), in->left());
    grpc::ByteBuffer answer(&slice, 1);
    call->stream.WriteAndFinish(answer, grpc::WriteOptions(), grpc::Status::OK,
                                &call->finish_tag);
  } else {
    call->stream.Finish(grpc::Status(static_cast<grpc::StatusCode>(code), detail),
                        &call->finish_tag);
  }
  return true;
}

void stop(uint32_t grace_ms) {
  if (g_shutting_down.exchange(true)) return;
  // Shutdown waits for the calls under way (their answers still come through the reader)
  // until the deadline, then cancels the rest; the queue ends after.
  std::thread([grace_ms] {
    g_server->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(grace_ms));
    {
      // A late PROCEED or FINISH must not start an operation on the closed queue.
      std::lock_guard<std::mutex> lock(g_mu);
      g_queue_closed = true;
    }
    g_cq->Shutdown();
  }).detach();
}

// Reads the API process's frames until the socket closes.
void read_frames() {
  std::string buf;
  std::vector<char> chunk(1 << 16);
  while (true) {
    ssize_t n = ::recv(g_fd, chunk.data(), chunk.size(), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    buf.append(chunk.data(), static_cast<size_t>(n));
    size_t at = 0;
    while (buf.size() - at >= 4) {
      uint32_t length;
      std::memcpy(&length, buf.data() + at, 4);
      if (length < kHeader - 4 || length > kMaxFrame) {
        std::fprintf(stderr, "dlaas-grpc-front: a broken frame from the API process\n");
        std::_Exit(2);
      }
      if (buf.size() - at - 4 < length) break;
      const char* p = buf.data() + at + 4;
      uint8_t type = static_cast<uint8_t>(p[0]);
      uint64_t id;
      std::memcpy(&id, p + 1, 8);
      In in(p + 9, length - 9);
      bool good = true;
      uint32_t grace;
      switch (type) {
        case kProceed:
          proceed(id);
          break;
        case kFinish:
          good = finish(id, &in);
          break;
        case kStop:
          good = in.u32(&grace);
          if (good) stop(grace);
          break;
        default:
          good = false;
      }
      if (!good) {
        std::fprintf(stderr, "dlaas-grpc-front: a malformed frame (type %u)\n", type);
        std::_Exit(2);
      }
      at += 4 + length;
    }
    buf.erase(0, at);
  }
}

// Loads the BPF program read (whole) from `fd` as a seccomp filter on every thread of
// the process; false, with why, if it cannot.
bool load_filter(int fd, std::string* why) {
  std::vector<char> bytes;
  char chunk[4096];
  for (;;) {
    ssize_t n = read(fd, chunk, sizeof chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      *why = std::string("cannot read its seccomp filter: ") + std::strerror(errno);
      return false;
    }
    if (n == 0) break;
    bytes.insert(bytes.end(), chunk, chunk + n);
  }
  close(fd);
  size_t count = bytes.size() / sizeof(sock_filter);
  if (count == 0 || count > BPF_MAXINSNS || bytes.size() % sizeof(sock_filter) != 0) {
    *why = "its seccomp filter is not a BPF program";
    return false;
  }
  std::vector<sock_filter> program(count);
  std::memcpy(program.data(), bytes.data(), bytes.size());
  sock_fprog fprog{static_cast<unsigned short>(count), program.data()};
  // Without privileges a filter needs no_new_privs (the sandbox has set it already).
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
      syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC, &fprog) != 0) {
    *why = std::string("cannot load its seccomp filter: ") + std::strerror(errno);
    return false;
  }
  return true;
}

bool parse_args(int argc, char** argv, int* fd, std::string* listen, long long* max_receive,
                int* filter) {
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i];
    char* end = nullptr;
    if (flag == "--fd") {
      *fd = static_cast<int>(std::strtol(argv[i + 1], &end, 10));
    } else if (flag == "--seccomp") {
      *filter = static_cast<int>(std::strtol(argv[i + 1], &end, 10));
      if (*filter < 0) return false;
    } else if (flag == "--listen") {
      *listen = argv[i + 1];
      continue;
    } else if (flag == "--max-receive") {
      *max_receive = std::strtoll(argv[i + 1], &end, 10);
    } else {
      return false;
    }
    if (end == nullptr || *end != '\0') return false;
  }
  return argc % 2 == 1 && *fd >= 0 && !listen->empty() && *max_receive > 0 &&
         *max_receive <= INT32_MAX;
}

}  // namespace

int main(int argc, char** argv) {
  int fd = -1;
  std::string listen;
  long long max_receive = 0;
  int filter = -1;
  if (!parse_args(argc, argv, &fd, &listen, &max_receive, &filter)) {
    std::fprintf(stderr,
                 "usage: dlaas-grpc-front --fd N --listen HOST:PORT --max-receive BYTES "
                 "[--seccomp FD]\n");
    return 64;
  }
  // If the parent is already gone, the socket's end of it is closed: the first read ends.
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  g_fd = fd;

  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort(listen, grpc::InsecureServerCredentials(), &port);
  builder.RegisterAsyncGenericService(&g_service);
  builder.SetMaxReceiveMessageSize(static_cast<int>(max_receive));
  builder.SetMaxSendMessageSize(-1);
  // A port another process holds is an error here, not a shared listener.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  g_cq = builder.AddCompletionQueue();
  g_server = builder.BuildAndStart();
  Outbox out;
  if (!g_server || port == 0) {
    Out frame(kFailed, 0);
    frame.str("could not listen on " + listen);
    out.add(frame.done());
    out.flush();
    return 1;
  }
  std::string why;
  if (filter >= 0 && !load_filter(filter, &why)) {
    Out frame(kFailed, 0);
    frame.str(why);
    out.add(frame.done());
    out.flush();
    return 1;
  }
  // Several calls may arrive at once; each arrival asks for the next.
  for (int i = 0; i < 16; ++i) await_next_call();
  Out ready(kReady, 0);
  ready.u32(static_cast<uint32_t>(port));
  out.add(ready.done());
  out.flush();

  std::thread queue(serve_queue);
  queue.detach();
  read_frames();
  // The socket closed: the API process is gone, and no call can be answered.
  std::_Exit(0);
}
