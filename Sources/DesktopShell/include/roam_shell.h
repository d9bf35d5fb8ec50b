#ifndef ROAM_SHELL_H
#define ROAM_SHELL_H

// The desktop app's window, through GTK 4 and libadwaita: the only code that sees GTK. Swift
// decides what to show (DesktopModel) and calls these with plain strings; GTK calls back with
// what the user did. Every function but roam_shell_post and roam_shell_background must be called
// on the main thread (from a callback, or before roam_shell_run).

#include <stdbool.h>

/// What the shell tells the app. Every callback runs on the main thread with `context`.
typedef struct RoamShellCallbacks {
    void *context;
    /// The application started (first instance only): build the window now.
    void (*activate)(void *context);
    /// The user flipped the switch to `on`.
    void (*switch_toggled)(void *context, bool on);
    /// The user pressed the portal banner's "Log in".
    void (*log_in)(void *context);
    /// Something posted with roam_shell_post arrived on the main thread.
    void (*deliver)(void *context, void *item);
    /// The user chose `key` on the app's notification (`default`: the notification itself).
    void (*notification_action)(void *context, const char *key);
    /// The user chose the tray menu's entry at `index` (as last given to roam_shell_tray_update).
    void (*menu_chosen)(void *context, int index);
    /// The user chose the file at `path` to import, in the file chooser the Welcome screen's
    /// import button opened.
    void (*import_chosen)(void *context, const char *path);
    /// A command roam_shell_run_command started, known by `tag`, ended with `status` (-1: it could
    /// not be started) after writing `output` (its standard output and error together).
    void (*command_finished)(void *context, int tag, int status, const char *output);
    /// The user pressed "Use" on the Profiles list's row at `index` (as last given to
    /// roam_shell_set_profiles).
    void (*profile_chosen)(void *context, int index);
} RoamShellCallbacks;

/// Runs the application with id `app_id` until its window closes; a second instance raises the
/// first's window and returns at once. Returns the exit status.
int roam_shell_run(const char *app_id, RoamShellCallbacks callbacks);

/// Makes the window, hidden until roam_shell_present.
void roam_shell_build_window(const char *title);

/// Brings the window to the front.
void roam_shell_present(void);

/// Keeps the app running while its window is closed or was never shown (started hidden): closing
/// the window hides it, and only Quit ends the app. Call before roam_shell_build_window.
void roam_shell_keep_running(void);

/// Puts the Welcome screen in the window (shown or hidden): its words, the import button's label
/// (insensitive while `busy`), and where an import stands (`import_status`, "" for nothing yet; an
/// error when `import_failed`).
void roam_shell_show_welcome(const char *title, const char *body, const char *detail, const char *import_label,
                             const char *import_status, bool import_failed, bool busy);

/// Puts the Details screen in the window: the state, a line under it, the switch, and the portal banner
/// (NULL: none).
void roam_shell_show_details(const char *state, const char *detail, bool switch_on, bool switch_enabled,
                             const char *banner, const char *banner_button);

/// The Details screen's list: `count` rows of a title and a value, in order.
void roam_shell_set_rows(int count, const char *const *titles, const char *const *values);

/// The Details screen's Profiles list: `count` rows of a name and a subtitle; a row whose
/// `buttons` entry is not NULL has a button of that label, named `descriptions`'s entry for screen
/// readers, that calls profile_chosen.
void roam_shell_set_profiles(int count, const char *const *names, const char *const *subtitles,
                             const char *const *buttons, const char *const *descriptions);

/// Says `text` briefly at the bottom of the window (a request refused, a login that could not
/// start).
void roam_shell_toast(const char *text);

/// Starts `argv` (NULL-terminated; argv[0] looked up in PATH) without waiting for it. Returns NULL,
/// or why it could not start (free it with free()).
char *roam_shell_spawn(const char *const *argv);

/// Starts `argv` (NULL-terminated; argv[0] looked up in PATH) with the `length` bytes of `input`
/// on its standard input, without waiting: command_finished gets `tag`, its exit status and what
/// it wrote. No argument may hold a secret (any user can read a process's arguments).
void roam_shell_run_command(const char *const *argv, const unsigned char *input, long length, int tag);

/// Shows the app's one notification through org.freedesktop.Notifications on the session bus,
/// replacing the one shown before: `count` actions, each a key and a label.
void roam_shell_notify(const char *title, const char *body, const char *icon, int count,
                       const char *const *keys, const char *const *labels);

/// Takes the app's notification away, if one is shown.
void roam_shell_withdraw(void);

/// The tray icon (a StatusNotifierItem with a dbusmenu, on the session bus): its icon name, its
/// tooltip and its flat menu of `count` entries. The first call puts it up; it shows whenever a
/// StatusNotifierWatcher runs, and while one does, closing the window leaves the app in the tray.
void roam_shell_tray_update(const char *icon, const char *tooltip, int count, const char *const *labels,
                            const bool *enabled);

/// Ends the application (the tray's "Quit").
void roam_shell_quit(void);

/// Hands `item` to the main thread, where `deliver` gets it. Safe from any thread.
void roam_shell_post(void *item);

/// Runs `work(argument)` on a thread of its own (detached). Safe from any thread.
void roam_shell_background(void (*work)(void *argument), void *argument);

#endif
