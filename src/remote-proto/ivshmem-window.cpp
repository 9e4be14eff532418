#include "remote-proto/ivshmem-window.h"

#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <thread>
#include <vector>

#include "core/spin.h"

namespace ferry::remote::ivshmem {

namespace {

constexpr const char* kPciRoot = "/sys/bus/pci/devices";

std::string read_line(const std::string& path) {
    std::ifstream f(path);
    std::string s;
    std::getline(f, s);
    return s;
}

// Maps `len` bytes of fd read-write, shared.
Expected<uint8_t*> map_shared(int fd, uint64_t len, const std::string& what) {
    void* p = mmap(nullptr, static_cast<size_t>(len), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        return Status::errorf("ivshmem window %s: mmap of %llu bytes: %s", what.c_str(),
                              static_cast<unsigned long long>(len), std::strerror(errno));
    }
    return static_cast<uint8_t*>(p);
}

bool looks_like_pci_address(const std::string& s) {
    // [DDDD:]BB:DD.F, hex digits.
    size_t colon = s.find(':');
    if (colon == std::string::npos || s.find('/') != std::string::npos) return false;
    for (char c : s) {
        if (!std::isxdigit(static_cast<unsigned char>(c)) && c != ':' && c != '.') return false;
    }
    return s.find('.') != std::string::npos;
}

// The sysfs folder of the first ivshmem device (vendor 0x1af4, device 0x1110).
Expected<std::string> find_ivshmem_device() {
    DIR* d = opendir(kPciRoot);
    if (!d) {
        return Status::errorf("ivshmem:auto: cannot list %s: %s (is sysfs mounted?)", kPciRoot,
                              std::strerror(errno));
    }
    std::vector<std::string> found;
    while (dirent* e = readdir(d)) {
        if (e->d_name[0] == '.') continue;
        const std::string dev = std::string(kPciRoot) + "/" + e->d_name;
        if (read_line(dev + "/vendor") == "0x1af4" && read_line(dev + "/device") == "0x1110") {
            found.push_back(dev);
        }
    }
    closedir(d);
    if (found.empty()) {
        return Status::errorf(
            "ivshmem:auto: no ivshmem PCI device (1af4:1110) under %s (start QEMU with "
            "-device ivshmem-plain,memdev=...)",
            kPciRoot);
    }
    std::sort(found.begin(), found.end());
    return found.front();
}

}  // namespace

Window::~Window() {
    if (base_) munmap(base_, static_cast<size_t>(size_));
}

Window::Window(Window&& o) noexcept : base_(o.base_), size_(o.size_), what_(std::move(o.what_)) {
    o.base_ = nullptr;
    o.size_ = 0;
}

Window& Window::operator=(Window&& o) noexcept {
    if (this != &o) {
        if (base_) munmap(base_, static_cast<size_t>(size_));
        base_ = o.base_;
        size_ = o.size_;
        what_ = std::move(o.what_);
        o.base_ = nullptr;
        o.size_ = 0;
    }
    return *this;
}

Expected<Window> Window::create(const std::string& path, uint64_t size) {
    if (size && (size < kMinWindow || size > kMaxWindow)) {
        return Status::errorf("ivshmem window %s: size %llu is outside %llu..%llu bytes",
                              path.c_str(), static_cast<unsigned long long>(size),
                              static_cast<unsigned long long>(kMinWindow),
                              static_cast<unsigned long long>(kMaxWindow));
    }
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) {
        return Status::errorf("ivshmem window %s: %s", path.c_str(), std::strerror(errno));
    }
    struct stat st {};
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        ::close(fd);
        return Status::errorf("ivshmem window %s: not a regular file", path.c_str());
    }
    uint64_t want = size;
    if (!want) want = st.st_size > 0 ? static_cast<uint64_t>(st.st_size) : kDefaultWindow;
    if (want < kMinWindow || want > kMaxWindow) {
        ::close(fd);
        return Status::errorf("ivshmem window %s: existing size %llu is outside %llu..%llu bytes",
                              path.c_str(), static_cast<unsigned long long>(want),
                              static_cast<unsigned long long>(kMinWindow),
                              static_cast<unsigned long long>(kMaxWindow));
    }
    if (static_cast<uint64_t>(st.st_size) != want && ftruncate(fd, static_cast<off_t>(want)) != 0) {
        const int e = errno;
        ::close(fd);
        return Status::errorf("ivshmem window %s: resizing to %llu bytes: %s", path.c_str(),
                              static_cast<unsigned long long>(want), std::strerror(e));
    }
    Expected<uint8_t*> p = map_shared(fd, want, path);
    ::close(fd);
    if (!p) return p.status();
    Window w;
    w.base_ = *p;
    w.size_ = want;
    w.what_ = path;
    return w;
}

Expected<Window> Window::open(const std::string& spec) {
    std::string file = spec;
    bool pci = false;
    if (spec == "auto") {
        Expected<std::string> dev = find_ivshmem_device();
        if (!dev) return dev.status();
        file = *dev + "/resource2";
        pci = true;
    } else if (looks_like_pci_address(spec)) {
        const std::string addr =
            std::count(spec.begin(), spec.end(), ':') == 1 ? "0000:" + spec : spec;
        const std::string dev = std::string(kPciRoot) + "/" + addr;
        if (read_line(dev + "/vendor") != "0x1af4" || read_line(dev + "/device") != "0x1110") {
            return Status::errorf("ivshmem:%s: %s is not an ivshmem device (1af4:1110)",
                                  spec.c_str(), dev.c_str());
        }
        file = dev + "/resource2";
        pci = true;
    }
    // O_SYNC: sysfs maps a BAR uncached only when asked; QEMU's ivshmem BAR is RAM anyway.
    const int fd = ::open(file.c_str(), O_RDWR | O_CLOEXEC | (pci ? O_SYNC : 0));
    if (fd < 0) {
        return Status::errorf(
            "ivshmem window %s: %s%s", file.c_str(), std::strerror(errno),
            errno == ENOENT && !pci ? " (is `ferry serve --listen ivshmem:PATH` running?)" : "");
    }
    struct stat st {};
    if (fstat(fd, &st) != 0) {
        const int e = errno;
        ::close(fd);
        return Status::errorf("ivshmem window %s: %s", file.c_str(), std::strerror(e));
    }
    const uint64_t size = static_cast<uint64_t>(st.st_size);
    if (size < kMinWindow || size > kMaxWindow) {
        ::close(fd);
        return Status::errorf("ivshmem window %s: %llu bytes, expected %llu..%llu", file.c_str(),
                              static_cast<unsigned long long>(size),
                              static_cast<unsigned long long>(kMinWindow),
                              static_cast<unsigned long long>(kMaxWindow));
    }
    Expected<uint8_t*> p = map_shared(fd, size, file);
    ::close(fd);
    if (!p) return p.status();
    Window w;
    w.base_ = *p;
    w.size_ = size;
    w.what_ = file;
    return w;
}

Geometry geometry_for(uint64_t size) {
    Geometry g;
    const uint64_t each = ((size - kHeaderBytes) / 2) & ~uint64_t{63};
    g.req_off = kHeaderBytes;
    g.req_cap = each;
    g.rep_off = kHeaderBytes + each;
    g.rep_cap = each;
    return g;
}

void ring_read(const uint8_t* ring, uint64_t cap, uint64_t pos, void* dst, size_t n) {
    const uint64_t at = pos % cap;
    const size_t first = static_cast<size_t>(std::min<uint64_t>(n, cap - at));
    std::memcpy(dst, ring + at, first);
    if (first < n) std::memcpy(static_cast<uint8_t*>(dst) + first, ring, n - first);
}

void ring_write(uint8_t* ring, uint64_t cap, uint64_t pos, const void* src, size_t n) {
    const uint64_t at = pos % cap;
    const size_t first = static_cast<size_t>(std::min<uint64_t>(n, cap - at));
    std::memcpy(ring + at, src, first);
    if (first < n) std::memcpy(ring, static_cast<const uint8_t*>(src) + first, n - first);
}

int64_t Backoff::waited_ms() const {
    if (!started_) return 0;
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                                 start_)
        .count();
}

int64_t Backoff::spin_us() {
    // Spinning costs a core. Where the process may use four or more, a waiter has one to
    // spare beside a two-thread compute and the other side of the window, and spinning through
    // a decode step's wait (a few hundred microseconds) removes the sleep's wake-up latency:
    // tiny-llama decode through the window went from 0.74 to 0.89 of local on a 16-core host.
    // With fewer, a spinning waiter takes the core the compute or the client needs (0.63 ->
    // 0.18 on the same host pinned to 2 cores), so it spins briefly and then sleeps
    // (bench/results/ivshmem.md). FERRY_IVSHMEM_SPIN_US=N overrides (0 to 50000).
    static const int64_t us = [] {
        if (const char* e = std::getenv("FERRY_IVSHMEM_SPIN_US")) {
            return std::clamp<int64_t>(std::atoll(e), 0, 50000);
        }
        cpu_set_t set;
        CPU_ZERO(&set);
        const int cpus = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 1;
        return int64_t{cpus >= 4 ? 300 : 20};
    }();
    return us;
}

void sleep_us(uint32_t us) {
    // The default timer slack (50 us) would stretch every short sleep to ~60 us: a thread
    // that waits for the other side of a window asks for 1 us (once per thread).
    thread_local bool slack_set = false;
    if (!slack_set) {
        prctl(PR_SET_TIMERSLACK, 1000UL, 0UL, 0UL, 0UL);
        slack_set = true;
    }
    timespec ts{static_cast<time_t>(us / 1000000), static_cast<long>(us % 1000000) * 1000};
    nanosleep(&ts, nullptr);
}

void Backoff::wait() {
    // Phases (why these numbers: a pipelined reply from the host usually follows within a few
    // microseconds; a decode step of a small model takes around a millisecond, so sleeps stay
    // short while a wait is young; a wait of more than 50 ms is a compute or an idle client).
    // The spin phase's length: spin_us().
    // No sched_yield() phase by default: on a loaded machine a yield hands the core to another
    // process's CPU-bound thread for a whole scheduler slice (milliseconds), while a sleeping
    // waiter is woken with preemption; measured, the yield phase cost tiny-llama decode through
    // the window 1.2-6x (bench/results/ivshmem.md). FERRY_IVSHMEM_YIELD_US=N brings a yield
    // phase back, up to N microseconds into a wait (for that comparison).
    constexpr int64_t kLongUs = 50000;
    static const int64_t kSpinUs = spin_us();
    static const int64_t kYieldUs = [] {
        const char* e = std::getenv("FERRY_IVSHMEM_YIELD_US");
        return e ? std::max<int64_t>(kSpinUs, std::atoll(e)) : kSpinUs;
    }();
    constexpr uint32_t kShortSleepMaxUs = 100;
    if (!started_) {
        started_ = true;
        start_ = std::chrono::steady_clock::now();
        spins_ = 0;
        sleep_us_ = 0;
    }
    spins_++;
    if ((spins_ & 63) != 0 && sleep_us_ == 0) {
        cpu_pause();
        return;
    }
    const int64_t us = std::chrono::duration_cast<std::chrono::microseconds>(
                           std::chrono::steady_clock::now() - start_)
                           .count();
    if (us < kSpinUs) return;
    if (us < kYieldUs) {
        sched_yield();
        return;
    }
    if (us >= kLongUs) {
        sleep_us_ = long_sleep_us_;
    } else {
        sleep_us_ = std::min(kShortSleepMaxUs, std::max<uint32_t>(10, sleep_us_ * 2));
    }
    sleep_us(sleep_us_);
}

Status parse_listen_spec(const std::string& spec, std::string* path, uint64_t* size) {
    *size = 0;
    const size_t comma = spec.find(',');
    *path = spec.substr(0, comma);
    if (path->empty()) return Status::errorf("ivshmem:%s: empty window path", spec.c_str());
    if (comma == std::string::npos) return Status::ok();
    const std::string opt = spec.substr(comma + 1);
    if (opt.rfind("size=", 0) != 0) {
        return Status::errorf("ivshmem:%s: unknown option '%s' (expected size=BYTES)", spec.c_str(),
                              opt.c_str());
    }
    const std::string v = opt.substr(5);
    char* end = nullptr;
    errno = 0;
    unsigned long long n = std::strtoull(v.c_str(), &end, 10);
    uint64_t mul = 1;
    if (end && *end) {
        const char s = static_cast<char>(std::toupper(static_cast<unsigned char>(*end)));
        mul = s == 'K' ? 1ull << 10 : s == 'M' ? 1ull << 20 : s == 'G' ? 1ull << 30 : 0;
        if (!mul || end[1] != '\0') mul = 0;
    }
    if (v.empty() || errno || !mul || !std::isdigit(static_cast<unsigned char>(v[0])) ||
        n > kMaxWindow / mul || n * mul < kMinWindow) {
        return Status::errorf("ivshmem:%s: bad size '%s' (bytes, K/M/G suffix, %llu..%llu)",
                              spec.c_str(), v.c_str(), static_cast<unsigned long long>(kMinWindow),
                              static_cast<unsigned long long>(kMaxWindow));
    }
    *size = n * mul;
    return Status::ok();
}

uint32_t new_epoch(uint32_t avoid) {
    for (;;) {
        uint32_t e = 0;
        if (getrandom(&e, sizeof(e), GRND_NONBLOCK) != sizeof(e)) {
            e = static_cast<uint32_t>(std::chrono::steady_clock::now().time_since_epoch().count() ^
                                      (static_cast<uint64_t>(getpid()) << 16));
        }
        if (e != 0 && e != avoid) return e;
    }
}

}  // namespace ferry::remote::ivshmem
