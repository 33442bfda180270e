// Env plug-ins (--env-plugin FILE, docs/agent.md "Your own environment").
//
// Loaded before the command line is parsed, so that --env knows their envs;
// the file an env came from is recorded in the run's checkpoints
// (metadata "env.plugin") and metrics.json, and --resume and eval load it
// again from there.
#pragma once
#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace segtape_cli {

// The checkpoint metadata key of the plug-in file a run's env comes from.
inline constexpr const char* kPluginKey = "env.plugin";

// The envs that --env-plugin files registered, each with its file (absolute).
std::map<std::string, std::string>& plugin_envs();

// The registered envs' names, ", "-separated, for error messages.
std::string registered_envs();

// Loads a plug-in; an error says which file and why (load_env_plugin's message starts with the file).
void load_plugin(const std::string& file);

// The --env-plugin values of a train or eval command line ("--env-plugin F"
// or "--env-plugin=F"; CLI11 parses them again, for their help and checks).
std::vector<std::string> plugin_args(int argc, char** argv);

// The plug-in a checkpoint's env comes from ("" for a built-in env): the
// file given with --env-plugin this time if it registered the env, else the
// file recorded in the checkpoint, loaded now. `where` names the flag and
// the checkpoint for the errors.
std::string checkpoint_plugin(const std::filesystem::path& ck, const std::string& env, const std::string& where);

}  // namespace segtape_cli
