// Stand-in for the sfpi RISC-V compiler (riscv-tt-elf-g++), for mock-mode ttnn only. setup.sh
// builds it with g++ into the kit's runtime/sfpi/compiler/bin/riscv-tt-elf-g++.
//
// ttnn 0.81.1 probes its kernel compiler before it opens a device, and JIT-builds kernels for
// every new program (fabric routers at a FABRIC_1D mesh open, then each op): a few calls per
// kernel, thousands on a cold kernel cache, each a process ttnn forks. A compiled stand-in costs
// ~1 ms a call where the Python one it replaced cost ~36 (measured: a cold tests/tt_mock.rs made
// 5,968 calls). Mock devices execute nothing, so no real kernel is needed. This stand-in:
//   --version   answers as the sfpi release the wheel pins (tt_metal/sfpi-version: 7.89.0, build
//               1050). The text goes into the firmware build key; with it, the key matches one of
//               the wheel's tt_metal/pre-compiled/<key>/ folders, so firmware is never built.
//   TT_MOCK_GXX=fail   every compile fails (op validation still runs: it comes before any compile).
//   TT_MOCK_GXX=stub   compiles write placeholder objects; a link writes the pre-compiled firmware
//               ELF of the same processor, for a kernel made loadable (an empty .rela.text and
//               contiguous load addresses, which the kernel loader checks). NO real code.
//   TT_MOCK_GXX_LOG=FILE   appends every call's arguments to FILE.
// Set TT_METAL_CACHE to a private folder: placeholder kernels have the real cache key.
// Every output is written to a temporary file beside it and renamed into place: test processes
// that share the kernel cache build the same kernels at once, and a reader must never see a
// partly written file (ttnn 0.81.1 waits forever on a truncated kernel ELF in its binary cache).
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using Bytes = std::vector<unsigned char>;
namespace fs = std::filesystem;

Bytes read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path);
  return Bytes(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// `data` at `path`, all at once for any reader (a rename within the folder).
void write_file(const std::string& path, const Bytes& data) {
  std::string dir = fs::path(path).parent_path().string();
  std::string tmp = (dir.empty() ? std::string(".") : dir) + "/.mock-XXXXXX";
  int fd = mkstemp(tmp.data());
  if (fd < 0) throw std::runtime_error("cannot create a file beside " + path);
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = write(fd, data.data() + done, data.size() - done);
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  bool ok = done == data.size() && fchmod(fd, 0644) == 0;
  ok = close(fd) == 0 && ok;
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    unlink(tmp.c_str());
    throw std::runtime_error("cannot write " + path);
  }
}

uint32_t u32(const Bytes& b, size_t at) {
  if (at + 4 > b.size()) throw std::runtime_error("ELF truncated");
  return b[at] | b[at + 1] << 8 | b[at + 2] << 16 | static_cast<uint32_t>(b[at + 3]) << 24;
}
uint16_t u16(const Bytes& b, size_t at) {
  if (at + 2 > b.size()) throw std::runtime_error("ELF truncated");
  return static_cast<uint16_t>(b[at] | b[at + 1] << 8);
}
void put_u32(Bytes& b, size_t at, uint32_t v) {
  for (int i = 0; i < 4; ++i) b[at + i] = static_cast<unsigned char>(v >> (8 * i));
}
void put_u16(Bytes& b, size_t at, uint16_t v) {
  b[at] = static_cast<unsigned char>(v);
  b[at + 1] = static_cast<unsigned char>(v >> 8);
}
void pad4(Bytes& b) {
  while (b.size() % 4) b.push_back(0);
}

// The bytes of firmware ELF `src` (32-bit little-endian RISC-V) made loadable as a kernel: an
// empty .rela.text section, and contiguous physical addresses of its LOAD segments (packed
// kernel images require them).
Bytes placeholder_kernel(const std::string& src) {
  Bytes b = read_file(src);
  if (b.size() < 52 ||
      std::memcmp(b.data(),
                  "\x7f"
                  "ELF",
                  4) != 0 ||
      b[4] != 1 || b[5] != 1)
    throw std::runtime_error(src + " is not a 32-bit little-endian ELF");
  uint32_t e_shoff = u32(b, 32);
  uint16_t e_shentsize = u16(b, 46), e_shnum = u16(b, 48), e_shstrndx = u16(b, 50);
  std::vector<std::vector<uint32_t>> shdrs(e_shnum, std::vector<uint32_t>(10));
  for (size_t i = 0; i < e_shnum; ++i)
    for (size_t f = 0; f < 10; ++f) shdrs[i][f] = u32(b, e_shoff + i * e_shentsize + 4 * f);
  if (e_shstrndx >= e_shnum) throw std::runtime_error(src + ": no section names");
  uint32_t str_at = shdrs[e_shstrndx][4], str_size = shdrs[e_shstrndx][5];
  if (static_cast<size_t>(str_at) + str_size > b.size()) throw std::runtime_error("ELF truncated");
  Bytes strtab(b.begin() + str_at, b.begin() + str_at + str_size);
  auto name = [&](size_t i) {
    size_t s = shdrs[i][0];
    if (s >= strtab.size()) throw std::runtime_error(src + ": a section name out of range");
    return std::string(
        reinterpret_cast<const char*>(strtab.data()) + s,
        strnlen(reinterpret_cast<const char*>(strtab.data()) + s, strtab.size() - s));
  };
  long text = -1, symtab = -1;
  for (size_t i = 0; i < e_shnum; ++i) {
    std::string n = name(i);
    if (n == ".rela.text") return b;
    if (n == ".text") text = static_cast<long>(i);
    if (n == ".symtab") symtab = static_cast<long>(i);
  }
  if (text < 0 || symtab < 0) throw std::runtime_error(src + " has no .text or no .symtab");
  Bytes new_str = strtab;
  const char rela[] = ".rela.text";
  new_str.insert(new_str.end(), rela, rela + sizeof rela);  // with its NUL
  pad4(b);
  uint32_t str_off = static_cast<uint32_t>(b.size());
  b.insert(b.end(), new_str.begin(), new_str.end());
  pad4(b);
  uint32_t rela_off = static_cast<uint32_t>(b.size());
  shdrs[e_shstrndx][4] = str_off;
  shdrs[e_shstrndx][5] = static_cast<uint32_t>(new_str.size());
  // sh_name, sh_type=SHT_RELA(4), flags=SHF_INFO_LINK(0x40), addr, offset, size, link, info,
  // addralign, entsize
  shdrs.push_back({static_cast<uint32_t>(strtab.size()), 4, 0x40, 0, rela_off, 0,
                   static_cast<uint32_t>(symtab), static_cast<uint32_t>(text), 4, 12});
  uint32_t sh_off = static_cast<uint32_t>(b.size());
  for (const auto& s : shdrs)
    for (uint32_t v : s) {
      b.resize(b.size() + 4);
      put_u32(b, b.size() - 4, v);
    }
  put_u32(b, 32, sh_off);
  put_u16(b, 48, static_cast<uint16_t>(shdrs.size()));
  uint32_t e_phoff = u32(b, 28);
  uint16_t e_phentsize = u16(b, 42), e_phnum = u16(b, 44);
  bool first = true;
  uint32_t lma = 0;
  for (size_t i = 0; i < e_phnum; ++i) {
    size_t o = e_phoff + i * e_phentsize;
    if (u32(b, o) != 1) continue;  // PT_LOAD
    if (first)
      lma = u32(b, o + 12);
    else
      put_u32(b, o + 12, lma);
    first = false;
    lma += (u32(b, o + 16) + 3) & ~3u;
  }
  return b;
}

bool ends_with(const std::string& s, const char* tail) {
  size_t n = std::strlen(tail);
  return s.size() >= n && s.compare(s.size() - n, n, tail) == 0;
}

// The firmware ELF a kernel link names (its `/…/<proc>_weakened.elf` argument, the ELF beside
// it), else the pre-compiled firmware of the output's processor.
std::string firmware_for(const std::vector<std::string>& args, const std::string& out) {
  for (const auto& a : args) {
    size_t weak = a.find("_weakened.elf"), slash = a.find('/');
    if (weak == std::string::npos || slash == std::string::npos || slash >= weak) continue;
    std::string elf = a.substr(slash, weak - slash) + ".elf";
    if (fs::exists(elf)) return elf;
  }
  std::string kind = fs::path(out).parent_path().filename().string();
  const char* root_env = std::getenv("TT_METAL_RUNTIME_ROOT");
  if (!root_env) return "";
  fs::path root = fs::path(root_env) / "tt_metal" / "pre-compiled";
  std::vector<std::string> keys;
  std::error_code ec;
  for (const auto& d : fs::directory_iterator(root, ec))
    keys.push_back(d.path().filename().string());
  std::sort(keys.begin(), keys.end());
  for (const auto& k : keys) {
    fs::path elf = root / k / kind / (kind + ".elf");
    if (fs::exists(elf)) return elf.string();
  }
  return "";
}

int run(const std::vector<std::string>& args) {
  if (const char* log = std::getenv("TT_MOCK_GXX_LOG")) {
    std::ofstream f(log, std::ios::app);
    for (size_t i = 0; i < args.size(); ++i) f << (i ? " " : "") << args[i];
    f << "\n";
  }
  auto has = [&](const char* flag) {
    return std::find(args.begin(), args.end(), flag) != args.end();
  };
  auto after = [&](const char* flag) {
    auto it = std::find(args.begin(), args.end(), flag);
    return it != args.end() && it + 1 != args.end() ? *(it + 1) : std::string();
  };
  if (!args.empty() && args[0] == "--version") {
    std::cout << "riscv-tt-elf-g++ (tenstorrent/sfpi:7.89.0[1050]) 15.1.0\n"
                 "Copyright (C) 2025 Free Software Foundation, Inc.\n"
                 "This is free software; see the source for copying conditions.  There is NO\n"
                 "warranty; not even for MERCHANTABILITY or FITNESS FOR A PARTICULAR PURPOSE.\n\n";
    return 0;
  }
  const char* mode = std::getenv("TT_MOCK_GXX");
  if (!mode || std::strcmp(mode, "stub") != 0) {
    std::cerr
        << "mock sfpi: no RISC-V compiler here (TT_MOCK_GXX=stub writes placeholder kernels)\n";
    return 1;
  }
  std::string out = after("-o");
  if (has("c++-header"))
    return 1;  // no precompiled headers: the build falls back to plain compiles
  if (out.empty()) {
    std::cerr << "mock sfpi: no -o output\n";
    return 1;
  }
  if (has("-c") || has("-E")) {
    const std::string object = "MOCK-OBJECT\n";
    write_file(out, Bytes(object.begin(), object.end()));
    std::string deps = after("-MF");
    if (!deps.empty()) {
      std::string sources;
      for (const auto& a : args)
        if (ends_with(a, ".cc") || ends_with(a, ".cpp") || ends_with(a, ".c") || ends_with(a, ".S"))
          sources += (sources.empty() ? "" : " ") + a;
      std::string rule = out + ": " + sources + "\n";
      write_file(deps, Bytes(rule.begin(), rule.end()));
    }
    return 0;
  }
  std::string firmware = firmware_for(args, out);
  if (firmware.empty()) {
    std::cerr << "mock sfpi: no pre-compiled firmware to stand in for " << out << "\n";
    return 1;
  }
  write_file(out, out.find("/kernels/") != std::string::npos ? placeholder_kernel(firmware)
                                                             : read_file(firmware));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(std::vector<std::string>(argv + 1, argv + argc));
  } catch (const std::exception& e) {
    std::cerr << "mock sfpi: " << e.what() << "\n";
    return 1;
  }
}
