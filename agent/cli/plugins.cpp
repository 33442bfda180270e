#include "plugins.h"

#include <cstring>

#include "segtape/agent/env.h"
#include "segtape/error.h"
#include "segtape/nn/safetensors.h"

namespace segtape_cli {

namespace fs = std::filesystem;
using segtape::Error;
using segtape::agent::env_registered;

std::map<std::string, std::string>& plugin_envs() {
  static std::map<std::string, std::string> m;
  return m;
}

std::string registered_envs() {
  std::string s;
  for (const std::string& n : segtape::agent::env_names()) s += (s.empty() ? "" : ", ") + n;
  return s;
}

void load_plugin(const std::string& file) {
  std::error_code ec;
  const std::string path = fs::weakly_canonical(fs::absolute(file, ec), ec).string();
  for (const std::string& name : segtape::agent::load_env_plugin(file)) plugin_envs()[name] = path;
}

std::vector<std::string> plugin_args(int argc, char** argv) {
  std::vector<std::string> files;
  if (argc < 2 || (std::strcmp(argv[1], "train") != 0 && std::strcmp(argv[1], "eval") != 0)) return files;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--") break;
    if (a == "--env-plugin" && i + 1 < argc) files.emplace_back(argv[++i]);
    else if (a.rfind("--env-plugin=", 0) == 0) files.push_back(a.substr(13));
  }
  return files;
}

std::string checkpoint_plugin(const fs::path& ck, const std::string& env, const std::string& where) {
  if (auto it = plugin_envs().find(env); it != plugin_envs().end()) return it->second;
  if (env_registered(env)) return "";
  const auto meta = segtape::safetensors::load(ck).metadata;
  const auto it = meta.find(kPluginKey);
  if (it == meta.end())
    throw Error(where + ": the checkpoint's env '" + env + "' is not registered (registered: " + registered_envs() +
                "); load the plug-in that defines it with --env-plugin FILE");
  try {
    load_plugin(it->second);
  } catch (const std::exception& e) {
    throw Error(where + ": the checkpoint's env '" + env + "' comes from the plug-in " + it->second +
                " (recorded in the checkpoint), which cannot be loaded (" + e.what() +
                "); pass --env-plugin FILE with the plug-in's path");
  }
  if (!env_registered(env))
    throw Error(where + ": the plug-in " + it->second + " recorded in the checkpoint no longer registers the env '" + env +
                "' (it registers: " + registered_envs() + ")");
  return plugin_envs()[env];
}

}  // namespace segtape_cli
