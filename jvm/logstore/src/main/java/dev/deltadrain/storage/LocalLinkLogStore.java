package dev.deltadrain.storage;

import io.delta.storage.HadoopFileSystemLogStore;
import java.io.FileNotFoundException;
import java.io.IOException;
import java.io.OutputStream;
import java.nio.channels.Channels;
import java.nio.channels.FileChannel;
import java.nio.charset.StandardCharsets;
import java.nio.file.FileAlreadyExistsException;
import java.nio.file.FileSystemException;
import java.nio.file.Files;
import java.nio.file.Paths;
import java.nio.file.StandardCopyOption;
import java.nio.file.StandardOpenOption;
import java.util.Iterator;
import java.util.UUID;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;

/**
 * A Delta log store for tables on a local or mounted POSIX file system, safe with writers in
 * several processes.
 *
 * <p>A Delta commit is correct only if writing version N fails when N already exists. Delta's
 * default store for {@code file:} paths checks that the file is absent and then renames over it
 * (rename(2) replaces), so two writers of one version can both pass the check: both believe they
 * committed and one commit is silently gone. Here the commit is written to a
 * hidden temporary file, synced, and published with a hard link, which the kernel refuses
 * atomically when the name exists. Nothing writes Hadoop {@code .crc} side files: a checksum
 * written apart from its file is what a lost race leaves mismatched.
 *
 * <p>Reads and listings are Delta's own ({@link HadoopFileSystemLogStore}).
 */
public class LocalLinkLogStore extends HadoopFileSystemLogStore {

  public LocalLinkLogStore(Configuration hadoopConf) {
    super(hadoopConf);
  }

  @Override
  public void write(Path path, Iterator<String> actions, Boolean overwrite, Configuration hadoopConf)
      throws IOException {
    java.nio.file.Path target = localPath(path, hadoopConf);
    java.nio.file.Path dir = target.getParent();
    if (!Files.isDirectory(dir)) {
      // As Delta's default store: Delta makes _delta_log itself, so a missing one is a removed table.
      throw new FileNotFoundException("File " + path.getParent() + " does not exist");
    }
    java.nio.file.Path temp = dir.resolve("." + target.getFileName() + "." + UUID.randomUUID() + ".tmp");
    try {
      try (FileChannel channel = FileChannel.open(temp, StandardOpenOption.CREATE_NEW, StandardOpenOption.WRITE);
           OutputStream out = Channels.newOutputStream(channel)) {
        while (actions.hasNext()) {
          out.write((actions.next() + "\n").getBytes(StandardCharsets.UTF_8));
        }
        out.flush();
        channel.force(true); // a power cut must not leave a published but empty commit
      }
      if (overwrite) {
        // A checksum Hadoop's file system left for the file being replaced would not match the new one.
        Files.deleteIfExists(dir.resolve("." + target.getFileName() + ".crc"));
        Files.move(temp, target, StandardCopyOption.ATOMIC_MOVE, StandardCopyOption.REPLACE_EXISTING);
      } else {
        publish(temp, target);
      }
    } finally {
      Files.deleteIfExists(temp);
    }
  }

  private static void publish(java.nio.file.Path temp, java.nio.file.Path target) throws IOException {
    try {
      Files.createLink(target, temp);
    } catch (FileAlreadyExistsException e) {
      throw e; // another writer has this version: Delta re-reads the log and checks for a conflict
    } catch (UnsupportedOperationException | FileSystemException e) {
      throw new IOException(
          "deltadrain cannot commit to " + target + ": its file system refuses hard links (" + e
              + "), which deltadrain's log store needs to publish a Delta commit atomically. Put the "
              + "lake on a file system with hard links (ext4, xfs, NFS, a Docker volume), or set "
              + "spark.delta.logStore.file.impl to a log store that fits it.", e);
    }
  }

  private static java.nio.file.Path localPath(Path path, Configuration hadoopConf) throws IOException {
    FileSystem fs = path.getFileSystem(hadoopConf);
    Path qualified = fs.makeQualified(path);
    if (!"file".equals(qualified.toUri().getScheme())) {
      throw new IOException(LocalLinkLogStore.class.getName() + " is for local paths only, not " + qualified);
    }
    return Paths.get(qualified.toUri());
  }

  /**
   * True, as for Delta's own file-system stores: this is about the file system, which shows a file
   * while it is written, and Delta then writes its other files (checkpoints) to a temporary name
   * first. The commits written above appear whole either way.
   */
  @Override
  public Boolean isPartialWriteVisible(Path path, Configuration hadoopConf) {
    return true;
  }
}
