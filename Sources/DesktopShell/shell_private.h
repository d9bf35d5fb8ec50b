#ifndef ROAM_SHELL_PRIVATE_H
#define ROAM_SHELL_PRIVATE_H

// What the window and the tray share inside the shell.

#include "roam_shell.h"

#include <gtk/gtk.h>

/// The app's callbacks, as roam_shell_run was given them.
extern RoamShellCallbacks roam_shell_callbacks;

/// Whether closing the window hides it (while the tray holds the app) or ends the app.
void roam_shell_hide_on_close(gboolean hide);

/// Opens the file chooser for a profile to import, over `window`; the chosen file goes to the
/// import_chosen callback.
void roam_shell_choose_profile(GtkWindow *window);

#endif
