#include "roam_shell.h"
#include "shell_private.h"

#include <gtk/gtk.h>

// The import's file chooser and the commands it runs (the check, pkexec).

static void chosen(GtkNativeDialog *dialog, int response, gpointer unused) {
    (void)unused;
    if (response == GTK_RESPONSE_ACCEPT) {
        GFile *file = gtk_file_chooser_get_file(GTK_FILE_CHOOSER(dialog));
        char *path = file != NULL ? g_file_get_path(file) : NULL;
        if (path != NULL) roam_shell_callbacks.import_chosen(roam_shell_callbacks.context, path);
        g_free(path);
        if (file != NULL) g_object_unref(file);
    }
    g_object_unref(dialog);
}

void roam_shell_choose_profile(GtkWindow *window) {
    // GtkFileDialog is GTK 4.10's; Debian 12 has 4.8. The native chooser is the desktop's portal
    // where one runs, else GTK's own dialog.
    GtkFileChooserNative *dialog = gtk_file_chooser_native_new("Import a profile", window, GTK_FILE_CHOOSER_ACTION_OPEN,
                                                               "_Import", "_Cancel");
    gtk_native_dialog_set_modal(GTK_NATIVE_DIALOG(dialog), TRUE);
    GtkFileFilter *profiles = gtk_file_filter_new();
    gtk_file_filter_set_name(profiles, "Roam profiles (*.yaml)");
    gtk_file_filter_add_pattern(profiles, "*.yaml");
    gtk_file_filter_add_pattern(profiles, "*.yml");
    gtk_file_chooser_add_filter(GTK_FILE_CHOOSER(dialog), profiles);
    g_object_unref(profiles);
    g_signal_connect(dialog, "response", G_CALLBACK(chosen), NULL);
    gtk_native_dialog_show(GTK_NATIVE_DIALOG(dialog));
}

static void finished(GObject *source, GAsyncResult *result, gpointer data) {
    int tag = GPOINTER_TO_INT(data);
    GSubprocess *process = G_SUBPROCESS(source);
    GBytes *output = NULL;
    GError *error = NULL;
    int status = -1;
    char *text;
    if (g_subprocess_communicate_finish(process, result, &output, NULL, &error)) {
        status = g_subprocess_get_if_exited(process) ? g_subprocess_get_exit_status(process) : -1;
        gsize length = 0;
        const char *bytes = output != NULL ? g_bytes_get_data(output, &length) : NULL;
        text = g_strndup(bytes != NULL ? bytes : "", length);
    } else {
        text = g_strdup(error->message);
        g_error_free(error);
    }
    roam_shell_callbacks.command_finished(roam_shell_callbacks.context, tag, status, text);
    g_free(text);
    if (output != NULL) g_bytes_unref(output);
    g_object_unref(process);
}

void roam_shell_run_command(const char *const *argv, const unsigned char *input, long length, int tag) {
    GError *error = NULL;
    GSubprocess *process = g_subprocess_newv(argv, G_SUBPROCESS_FLAGS_STDIN_PIPE | G_SUBPROCESS_FLAGS_STDOUT_PIPE
                                                       | G_SUBPROCESS_FLAGS_STDERR_MERGE, &error);
    if (process == NULL) {
        roam_shell_callbacks.command_finished(roam_shell_callbacks.context, tag, -1, error->message);
        g_error_free(error);
        return;
    }
    GBytes *bytes = g_bytes_new(input, (gsize)(length > 0 ? length : 0));
    g_subprocess_communicate_async(process, bytes, NULL, finished, GINT_TO_POINTER(tag));
    g_bytes_unref(bytes);
}
