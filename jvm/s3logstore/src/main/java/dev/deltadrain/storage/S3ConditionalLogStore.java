package dev.deltadrain.storage;

import io.delta.storage.HadoopFileSystemLogStore;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.FileAlreadyExistsException;
import java.util.Arrays;
import java.util.Iterator;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;

/**
 * A Delta log store for tables on S3 (or an S3-compatible store) through hadoop-aws, safe with
 * writers in several drivers.
 *
 * <p>A Delta commit is correct only if writing version N fails when N already exists. Delta's own
 * S3 store ({@code S3SingleDriverLogStore}) checks for the file under a lock held in its JVM, then
 * writes it with a plain PUT, which replaces the file another driver wrote meanwhile: both drivers
 * believe they committed and one commit is gone. Here a new commit is written with a conditional
 * PUT ({@code If-None-Match: *}, hadoop-aws's {@code fs.option.create.conditional.overwrite}), which
 * the store refuses with 412 when the key exists. That needs a store that implements conditional
 * writes atomically (Amazon S3 since 2024; see docs/object-store.md for the embedded server).
 *
 * <p>A PUT whose answer was lost and that hadoop-aws retried meets its own object: the retry is
 * refused although the commit is ours. So after a refusal the object is read back, and the write
 * counts as done when it holds exactly our bytes (a commit carries its own timestamp and
 * transaction id, so another writer's commit does not).
 *
 * <p>Reads and listings are Delta's own ({@link HadoopFileSystemLogStore}); S3 lists consistently.
 */
public class S3ConditionalLogStore extends HadoopFileSystemLogStore {

  /** hadoop-aws (3.4.2 and later): send If-None-Match: * with the PUT of a file created without overwrite. */
  public static final String CONDITIONAL_CREATE = "fs.option.create.conditional.overwrite";

  public S3ConditionalLogStore(Configuration hadoopConf) {
    super(hadoopConf);
  }

  @Override
  public void write(Path path, Iterator<String> actions, Boolean overwrite, Configuration hadoopConf)
      throws IOException {
    FileSystem fs = path.getFileSystem(hadoopConf);
    byte[] bytes = serialise(actions);
    if (overwrite) {
      try (FSDataOutputStream out = fs.create(path, true)) {
        out.write(bytes);
      }
      return;
    }
    try {
      // The conditional PUT alone decides: hadoop-aws sends If-None-Match: * with the PUT at close(),
      // which the store refuses atomically (412) when the key exists. overwrite(true) only skips
      // hadoop-aws's own existence check, a second answer that could only be older.
      FSDataOutputStream out =
          (FSDataOutputStream) fs.createFile(path).overwrite(true).must(CONDITIONAL_CREATE, true).build();
      try {
        out.write(bytes);
      } finally {
        out.close();
      }
    } catch (IOException e) {
      // The PUT was refused (412: hadoop-aws's RemoteFileChangedException, the cause of what is thrown
      // below), or another failure after which the object is there.
      if (!fs.exists(path)) {
        throw e;
      }
      if (!holds(fs, path, bytes)) {
        // Another writer has this version. Delta expects java.nio's exception: it then re-reads the
        // log and checks the winner for a conflict.
        FileAlreadyExistsException taken = new FileAlreadyExistsException(path.toString());
        taken.initCause(e);
        throw taken;
      }
    }
  }

  private static byte[] serialise(Iterator<String> actions) {
    ByteArrayOutputStream buffer = new ByteArrayOutputStream();
    while (actions.hasNext()) {
      buffer.writeBytes((actions.next() + "\n").getBytes(StandardCharsets.UTF_8));
    }
    return buffer.toByteArray();
  }

  /** Whether the object at `path` holds exactly `bytes`: our own write, whose answer was lost. */
  private static boolean holds(FileSystem fs, Path path, byte[] bytes) throws IOException {
    try (InputStream in = fs.open(path)) {
      byte[] there = in.readNBytes(bytes.length + 1);
      return Arrays.equals(there, bytes);
    } catch (java.io.FileNotFoundException gone) {
      return false;
    }
  }

  /** False: an S3 object appears whole when its PUT completes, never part-written. */
  @Override
  public Boolean isPartialWriteVisible(Path path, Configuration hadoopConf) {
    return false;
  }
}
